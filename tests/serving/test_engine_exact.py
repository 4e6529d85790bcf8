"""The serving engine's tokens equal one-process greedy decoding and ``transformers``' ``generate``.

Exactness across batching and TP sums: the models run in float64, where a different order of a sum
moves a logit by about 1e-16; greedy decoding then picks the same token unless two logits tie to that
precision (the random weights are spread wide so they do not: the margin is checked below).
"""

from __future__ import annotations

import random

import pytest
import torch

from shardlib.core.checkpoints import hf_llama_from_weights, weights_from_hf_llama
from shardlib.core.config import ModelConfig, kv_bytes_per_token
from shardlib.core.model import forward_reference, greedy_reference, random_weights
from shardlib.core.serving.loop import serve_in_process
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.lab.serving.engine_drivers import run_serving
from shardlib.lab.serving.hf import hf_greedy_tokens, load_llama_checkpoint, random_hf_llama
from shardlib.runtime.ranks import Ranks

pytest.importorskip("transformers")


pytestmark = pytest.mark.usefixtures("one_thread")  # one torch thread here, as a rank has


@pytest.fixture(scope="module")
def hf_model():
    return random_hf_llama(seed=0)  # 2 layers, d 32, 4 query heads, 2 KV heads, V 97, float64


@pytest.fixture(scope="module")
def weights(hf_model):
    return weights_from_hf_llama(hf_model.state_dict(), hf_model.config)


def mixed_trace(n=8, seed=0, shared=0, spacing_s=0.0):
    rng = random.Random(seed)
    system = [rng.randrange(97) for _ in range(shared)]
    return [Request(i, (system if i % 2 else []) + [rng.randrange(97) for _ in range(rng.randrange(1, 24))],
                    rng.randrange(1, 14), arrival_s=i * spacing_s) for i in range(n)]


@pytest.fixture(scope="module")
def trace_and_reference(weights):
    requests = mixed_trace(shared=12)
    return requests, {r.request_id: greedy_reference(weights, r.prompt_token_ids, r.max_new_tokens) for r in requests}


def test_the_model_is_transformers_llama(hf_model, weights):
    ids = torch.tensor([5, 17, 3, 88, 40, 2, 9, 61])
    with torch.no_grad():
        theirs = hf_model(ids[None]).logits[0]
    ours = forward_reference(weights, ids)
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-12)
    top2 = ours.topk(2, dim=-1).values
    assert float((top2[:, 0] - top2[:, 1]).min()) > 1e-9  # no near-tie for a reordered sum to flip


def test_greedy_reference_equals_transformers_generate(hf_model, weights, trace_and_reference):
    requests, reference = trace_and_reference
    assert hf_greedy_tokens(hf_model, requests) == reference


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=16),
    EngineConfig(block_size=1, num_blocks=200, max_batch_tokens=7),
    EngineConfig(block_size=16, num_blocks=6, max_batch_tokens=64),  # preempts
    EngineConfig(block_size=8, num_blocks=16, max_batch_tokens=48, chunked_prefill=False),
    EngineConfig(block_size=4, num_blocks=20, max_batch_tokens=9, prefix_caching=False),
])
def test_one_process_engine_is_exact_for_every_policy(weights, trace_and_reference, config):
    requests, reference = trace_and_reference
    model = PagedModel(weights, TPGroup(1, 0), config.num_blocks, config.block_size)
    assert serve_in_process(requests, config, model.step) == reference


@pytest.mark.parametrize("world", [1, 2, 4])
def test_on_ranks_exact_at_every_tp_with_preemption_and_prefix_caching(weights, trace_and_reference, world,
                                                                      request):
    requests, reference = trace_and_reference
    ranks = Ranks(1) if world == 1 else request.getfixturevalue(f"pool{world}")
    try:
        tight = run_serving(ranks, weights, requests, EngineConfig(block_size=4, num_blocks=14, max_batch_tokens=12))
        assert tight.tokens == reference
        assert tight.preemptions > 0  # the cache held too few blocks for every request at once
        assert tight.prefix_hit_tokens > 0  # the odd requests share a 12-token system prompt
        roomy = run_serving(ranks, weights, requests, EngineConfig(block_size=8, num_blocks=40, max_batch_tokens=64,
                                                                   prefix_caching=False, chunked_prefill=False))
        assert roomy.tokens == reference and roomy.prefix_hit_tokens == 0
    finally:
        if world == 1:
            ranks.close()


def test_kv_cache_bytes_predicted_equal_the_cache_tensors(weights, pool4):
    config = EngineConfig(block_size=4, num_blocks=10, max_batch_tokens=16)
    run = run_serving(pool4, weights, [Request(0, [1, 2, 3], 2)], config)
    c = weights.config  # 2 KV heads over 4 ranks: one copy of one head each
    per_token = 2 * c.n_layers * 1 * c.head_dim * 8
    assert kv_bytes_per_token(c.n_layers, c.n_kv_heads, c.head_dim, 8, tp=4) == per_token
    assert run.kv_cache_bytes == (per_token * config.capacity_tokens,) * 4


def test_metrics_are_measured_per_request(weights, pool2):
    requests = mixed_trace(n=4, spacing_s=0.02)
    run = run_serving(pool2, weights, requests, EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=32))
    for r in requests:
        m = run.metrics[r.request_id]
        assert m.ttft_s > 0 and m.e2e_s >= m.ttft_s
        assert (m.tpot_s > 0) == (r.max_new_tokens > 1)
    assert run.percentile("ttft_s", 100) == max(m.ttft_s for m in run.metrics.values())
    assert sum(map(len, run.tokens.values())) == sum(r.max_new_tokens for r in requests)


@pytest.mark.parametrize("bad, message", [
    (dict(requests=[Request(0, [1] * 120, 20)]), "more than the model's context of 128"),
    (dict(requests=[Request(0, [1] * 40, 20)], config=EngineConfig(block_size=4, num_blocks=10)),
     "more than the whole cache"),
    (dict(config=EngineConfig(block_size=48)), "block_size = 48 does not divide the model's context of 128"),
    (dict(requests=[Request(0, [1, 500], 2)]), "past the vocabulary of 97"),
    (dict(requests=[]), "at least one Request"),
])
def test_bad_input_is_refused_before_any_rank_starts(weights, pool2, bad, message):
    args = dict(requests=[Request(0, [1, 2], 2)], config=EngineConfig())
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        run_serving(pool2, weights, args["requests"], args["config"])


def test_a_model_that_does_not_split_is_refused(pool4):
    odd = random_hf_llama(seed=1, num_attention_heads=2, num_key_value_heads=2, hidden_size=16)
    w = weights_from_hf_llama(odd.state_dict(), odd.config)
    with pytest.raises(ValueError, match="2 query heads cannot be split 4 ways"):
        run_serving(pool4, w, [Request(0, [1, 2], 2)], EngineConfig())


def test_a_checkpoint_on_disk_loads_to_the_same_weights(hf_model, weights, tmp_path):
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_llama_checkpoint(tmp_path)
    assert loaded.config == weights.config
    assert all(torch.equal(a[k], b[k]) for a, b in zip(loaded.layers, weights.layers) for k in a)
    with pytest.raises(ValueError, match="has no config.json"):
        load_llama_checkpoint(tmp_path / "nowhere")


def test_weights_written_back_are_the_transformers_state_dict(hf_model, weights):
    state, config = hf_llama_from_weights(weights)
    original = hf_model.state_dict()
    assert set(state) == {k for k in original if k.endswith(".weight")}
    assert all(torch.equal(t, original[k]) for k, t in state.items())
    assert weights_from_hf_llama(state, config).config == weights.config


def test_random_weights_need_no_transformers_and_serve_exactly():
    config = ModelConfig("llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48,
                         max_positions=64, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    w = random_weights(config, seed=3, dtype=torch.float64)
    requests = mixed_trace(n=4)
    requests = [Request(r.request_id, [t % 64 for t in r.prompt_token_ids], r.max_new_tokens) for r in requests]
    reference = {r.request_id: greedy_reference(w, r.prompt_token_ids, r.max_new_tokens) for r in requests}
    model = PagedModel(w, TPGroup(1, 0), 40, 4)
    assert serve_in_process(requests, EngineConfig(block_size=4, num_blocks=40, max_batch_tokens=8), model.step) == \
        reference


def test_paged_blocks_hold_real_tokens_where_contiguous_reservations_would_not(weights, pool2):
    from shardlib.predict.serving.engine import contiguous_utilization

    requests = mixed_trace(n=8)
    config = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=32, prefix_caching=False)
    run = run_serving(pool2, weights, requests, config)
    measured = run.kv_utilization()  # tokens held over the slots of the blocks in use, step by step
    reserved = contiguous_utilization(requests, reserved_tokens=weights.config.max_positions)
    assert 0.7 < measured <= 1.0  # only each sequence's last block is part empty
    assert reserved < 0.35  # every request reserving the 128-token context
    assert measured > 2 * reserved


def test_seeded_sampling_gives_the_same_tokens_whatever_the_batching(weights, pool2):
    requests = [Request(r.request_id, r.prompt_token_ids, r.max_new_tokens, seed=10 + i)
                for i, r in enumerate(mixed_trace(n=6))]
    a = run_serving(pool2, weights, requests, EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=32))
    b = run_serving(pool2, weights, requests, EngineConfig(block_size=8, num_blocks=10, max_batch_tokens=5))
    model = PagedModel(weights, TPGroup(1, 0), 64, 4)
    alone = serve_in_process(requests, EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=64), model.step)
    assert a.tokens == b.tokens == alone
    greedy = {r.request_id: greedy_reference(weights, r.prompt_token_ids, r.max_new_tokens) for r in requests}
    assert a.tokens != greedy  # the draws are real draws, not the argmax
