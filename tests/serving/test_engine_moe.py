"""The serving engine serves Mixtral exactly: its tokens equal ``transformers``' greedy ``generate``.

The attention runs tensor-parallel as a Llama's does; each MoE layer's experts are spread whole over the same
ranks, the tokens sent to them by all-to-all. In float64, with the weights spread wide, no two logits (and no
two of the router's choices) are near enough to tie for a reordered sum to flip a token: checked below.
"""

from __future__ import annotations

import pytest
import torch

from shardlib.core.checkpoints import hf_llama_from_weights, weights_from_hf, weights_from_hf_llama
from shardlib.core.experts.dispatch import moe_reference
from shardlib.core.model import forward_reference, greedy_reference
from shardlib.core.serving.loop import serve_in_process
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.lab.serving.engine_drivers import check_serving, reference_tokens, run_serving
from shardlib.lab.serving.hf import load_llama_checkpoint, random_hf_llama, random_hf_mixtral
from shardlib.lab.serving.traces import every_other_shared_trace
from shardlib.runtime.ranks import Ranks

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")  # one torch thread here, as a rank has


@pytest.fixture(scope="module")
def hf_model():
    return random_hf_mixtral(seed=0)  # 2 layers, d 32, 4 query heads, 2 KV heads, 4 experts, 2 a token, float64


@pytest.fixture(scope="module")
def weights(hf_weights):
    return hf_weights


trace = every_other_shared_trace  # 8 requests, every other one under a 12-token system prompt


def test_the_model_is_transformers_mixtral_with_no_near_tie(hf_model, weights, generated):
    ids = torch.tensor([5, 17, 3, 88, 40, 2, 9, 61])
    with torch.no_grad():
        theirs = hf_model(ids[None]).logits[0]
    assert torch.allclose(forward_reference(weights, ids, moe_reference), theirs, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="this block has experts: pass moe="):
        forward_reference(weights, ids)
    tokens, margin = reference_tokens(weights, trace())
    assert tokens == generated and margin > 1e-6  # the top two logits of every token chosen
    gaps = []  # the router's k-th and (k+1)-th probabilities, float32 as transformers computes them
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, out: gaps.append(
        (lambda p: p[:, 1] - p[:, 2])(torch.softmax(out[0].float(), -1).sort(-1, descending=True).values)))
        for layer in hf_model.model.layers]
    with torch.no_grad():
        for r in trace():
            hf_model(torch.tensor([list(r.prompt_token_ids) + list(generated[r.request_id])]))
    for h in hooks:
        h.remove()
    assert float(torch.cat(gaps).min()) > 1e-5  # about 200 float32 steps: no expert choice near a tie


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=16),
    EngineConfig(block_size=1, num_blocks=200, max_batch_tokens=7),
    EngineConfig(block_size=16, num_blocks=6, max_batch_tokens=64),  # preempts
    EngineConfig(block_size=8, num_blocks=16, max_batch_tokens=48, chunked_prefill=False),
    EngineConfig(block_size=4, num_blocks=20, max_batch_tokens=9, prefix_caching=False),
])
def test_one_process_engine_is_exact_for_every_policy(weights, generated, config):
    model = PagedModel(weights, TPGroup(1, 0), config.num_blocks, config.block_size)
    assert serve_in_process(trace(), config, model.step) == generated


def test_each_rank_holds_only_its_block_of_experts(weights):
    for tp in (2, 4):
        n = 4 // tp
        for r in range(tp):
            model = PagedModel(weights, TPGroup(tp, r), 8, 4)
            for block, w in zip(model.layers, weights.layers):
                assert block.mlp.expert_gate.shape == (n, 48, 32)  # (experts here, d_ff, d_model)
                for key in ("expert_gate", "expert_up", "expert_down"):
                    assert torch.equal(getattr(block.mlp, key), w[key][r * n:(r + 1) * n])
                assert torch.equal(block.mlp.router, w["router"])  # the router whole on every rank


@pytest.mark.parametrize("world", [1, 2, 4])
def test_on_ranks_exact_with_experts_spread_preemption_and_prefix_caching(weights, generated, world, request):
    ranks = Ranks(1) if world == 1 else request.getfixturevalue(f"pool{world}")
    try:
        tight = run_serving(ranks, weights, trace(), EngineConfig(block_size=4, num_blocks=14, max_batch_tokens=12))
        assert tight.tokens == generated
        assert tight.preemptions > 0 and tight.prefix_hit_tokens > 0
        roomy = run_serving(ranks, weights, trace(), EngineConfig(block_size=8, num_blocks=40, max_batch_tokens=64,
                                                                  prefix_caching=False, chunked_prefill=False))
        assert roomy.tokens == generated
        alone = run_serving(ranks, weights, trace()[3:4], EngineConfig(block_size=4, num_blocks=16))
        assert alone.tokens == {3: generated[3]}  # one token a decode step: some ranks route no token
        if world > 1:  # per step, per layer: the counts' all-to-all, the rows' there and back; one all-gather
            steps, row_bytes = len(tight.steps), 32 * 8
            for rank in range(world):
                mine = [c for c in tight.got.comm if c.rank == rank]
                a2a = [c for c in mine if c.op == "all_to_all_single"]
                assert len(a2a) == 3 * 2 * steps
                assert sum(c.op == "all_gather" for c in mine) == 2 * steps
                assert any(c.wire_bytes >= row_bytes for c in a2a)  # rows left this rank for another's experts
    finally:
        if world == 1:
            ranks.close()


@pytest.mark.parametrize("prefill_ranks", [1, 2])
def test_disaggregated_pools_of_different_tp_serve_mixtral_exactly(weights, generated, prefill_ranks):
    """1 + 2 and 2 + 1 on 3 ranks: each pool spreads the experts over its own ranks, the K/V cross by rank
    pair, and the tokens are still transformers' greedy ones."""
    from shardlib.lab.serving.disagg import run_disaggregated

    with Ranks(3) as three:
        run = run_disaggregated(three, weights, trace(), EngineConfig(block_size=8, num_blocks=40, max_batch_tokens=64),
                                prefill_ranks=prefill_ranks)
    assert run.tokens == generated
    assert run.kv_link_bytes_sent == run.kv_link_bytes_predicted


def test_experts_that_do_not_spread_evenly_are_refused(weights):
    odd = random_hf_mixtral(seed=1, num_local_experts=6)
    w = weights_from_hf(odd.state_dict(), odd.config)
    with pytest.raises(ValueError, match="6 experts cannot be spread over 4 ranks"):
        check_serving(w, [Request(0, [1, 2], 2)], EngineConfig(), 4)
    check_serving(w, [Request(0, [1, 2], 2)], EngineConfig(), 2)  # d_ff 48 need not split: experts stay whole


def test_a_mixtral_checkpoint_on_disk_loads_to_the_same_weights(hf_model, weights, tmp_path):
    hf_model.save_pretrained(tmp_path, safe_serialization=True)  # Mistral's names: one w1, w2, w3 per expert
    loaded = load_llama_checkpoint(tmp_path)
    assert loaded.config == weights.config
    assert all(torch.equal(a[k], b[k]) for a, b in zip(loaded.layers, weights.layers) for k in a)
    with pytest.raises(ValueError, match="mixtral has experts: only a dense Llama's weights are written back"):
        hf_llama_from_weights(weights)


def test_weights_from_hf_reads_a_llama_as_weights_from_hf_llama_does():
    llama = random_hf_llama(seed=0)
    a = weights_from_hf(llama.state_dict(), llama.config)
    b = weights_from_hf_llama(llama.state_dict(), llama.config.to_dict())
    assert a.config == b.config and not a.config.is_moe
    assert all(torch.equal(x[k], y[k]) for x, y in zip(a.layers, b.layers) for k in x)
    assert torch.equal(a.embed, b.embed) and torch.equal(a.head, b.head) and torch.equal(a.norm, b.norm)
    assert greedy_reference(a, [5, 17, 3], 4) == greedy_reference(b, [5, 17, 3], 4)


@pytest.mark.parametrize("model_type", ["qwen3_moe", "qwen2"])
def test_an_architecture_the_engine_does_not_serve_is_named(model_type):
    config = {"model_type": model_type, "vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 64}
    served = rf"serves llama, mixtral, deepseek_v3 models \({model_type} is not served yet\)"
    with pytest.raises(ValueError, match=served):
        weights_from_hf({}, config)


def test_a_missing_expert_is_named(hf_model):
    state = dict(hf_model.state_dict())
    del state["model.layers.1.mlp.experts.down_proj"]
    with pytest.raises(ValueError, match="layer 1 is incomplete: 'model.layers.1.mlp.experts.down_proj' missing"):
        weights_from_hf(state, hf_model.config)
