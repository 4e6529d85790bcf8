"""The serving engine serves DeepSeek-V3 exactly: multi-head latent attention over a paged cache of latents, the
first layer dense, then routed experts (sigmoid gates, a selection bias, groups) beside a shared expert.

The cache holds one entry a token a layer, the normed latent and the rotated shared key (``kv_rank + rope_dim``
values), whatever the heads; the attention is served absorbed (each head's query moved into the latent's space).
Tensor parallelism splits the heads but not the latent: every rank computes and caches every token's whole
entry. The router scores in float32, as ``transformers`` does; a float32 multiply rounds differently with the
rows it shares a call with, so logits agree to about 1e-6, not 1e-12: far inside the margins checked below.
"""

from __future__ import annotations

import pytest
import torch

from shardlib.core.checkpoints import weights_from_hf
from shardlib.core.config import MLAShape, ModelConfig, kv_bytes_per_token
from shardlib.core.experts.dispatch import moe_reference
from shardlib.core.model import forward_reference, latent_attention, latent_attention_reference
from shardlib.core.serving.loop import serve_in_process
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.requests import EngineConfig
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.facts.models import DEEPSEEK_V3
from shardlib.lab.serving.engine_drivers import reference_tokens, run_serving
from shardlib.lab.serving.hf import random_hf_deepseek_v3
from shardlib.lab.serving.traces import every_other_shared_trace
from shardlib.runtime.ranks import Ranks

pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf_model():
    return random_hf_deepseek_v3(seed=0)  # 3 layers (1 dense), 4 heads, latent 12 + rope 4, 8 experts, float64


@pytest.fixture(scope="module")
def weights(hf_weights):
    return hf_weights


trace = every_other_shared_trace  # 8 requests, every other one under a 12-token system prompt


def test_the_config_is_read_as_deepseek_v3_lays_it_out(weights):
    c = weights.config
    assert c.mla == MLAShape(kv_rank=12, rope_dim=4, nope_dim=8, v_dim=8, q_rank=16, interleaved=True)
    assert c.kv_latent_dim == 16 and c.dense_layers == 1 and c.expert_width == 24 and c.shared_experts == 1
    assert (c.router_gate, c.routed_scale, c.expert_groups, c.node_limit) == ("sigmoid-topk", 2.5, 4, 2)
    assert "gate" in weights.layers[0] and "router" not in weights.layers[0]  # the first layer dense
    assert weights.layers[1]["router_bias"].abs().sum() > 0  # the selection bias is read, and drawn non-zero
    # DeepSeek-V3's published ranks give its attention weights a layer, counted by hand, and its 576 cached values
    hand = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168
    assert DEEPSEEK_V3.attention_params_per_layer == hand == 187_105_280 and DEEPSEEK_V3.kv_latent_dim == 576


def test_the_model_is_transformers_deepseek_v3_with_no_near_tie(hf_model, weights, generated):
    ids = torch.tensor([5, 17, 3, 88, 40, 2, 9, 61])
    with torch.no_grad():
        theirs = hf_model(ids[None]).logits[0]
    assert torch.allclose(forward_reference(weights, ids, moe_reference), theirs, rtol=0, atol=1e-5)
    tokens, margin = reference_tokens(weights, trace())
    assert tokens == generated and margin > 1e-3  # a thousand times the float32 router's wobble
    gaps = []  # each token's k-th and (k+1)-th choice scores (bias counted, groups masked), float32 as transformers'
    for layer in hf_model.model.layers[1:]:
        def hook(m, i, out):
            x = i[0].view(-1, 32).float()
            s = torch.sigmoid(x @ m.weight.float().T) + m.e_score_correction_bias
            top = s.topk(5, dim=-1).values
            gaps.append(top[:, 3] - top[:, 4])
        layer.mlp.gate.register_forward_hook(hook)
    with torch.no_grad():
        for r in trace():
            hf_model(torch.tensor([list(r.prompt_token_ids) + list(generated[r.request_id])]))
    for layer in hf_model.model.layers[1:]:
        layer.mlp.gate._forward_hooks.clear()
    assert float(torch.cat(gaps).min()) > 1e-5  # no expert choice near a tie


def test_absorbed_attention_equals_the_papers(weights):
    """Served, W_UK moves into the query and W_UV after the attention; the paper's keys and values rebuilt
    per head give the same output, in float64 to rounding."""
    x = torch.randn(9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    for w in weights.layers:
        assert torch.allclose(latent_attention(x, w, weights.config), latent_attention_reference(x, w, weights.config),
                              rtol=0, atol=1e-12)


@pytest.mark.parametrize("config", [
    EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=16),
    EngineConfig(block_size=16, num_blocks=6, max_batch_tokens=64),  # preempts
    EngineConfig(block_size=8, num_blocks=16, max_batch_tokens=48, chunked_prefill=False),
])
def test_one_process_engine_is_exact(weights, generated, config):
    model = PagedModel(weights, TPGroup(1, 0), config.num_blocks, config.block_size)
    assert serve_in_process(trace(), config, model.step) == generated


def test_the_cache_holds_one_latent_entry_a_token_a_layer(weights):
    """Predicted: 3 layers x (12 + 4) values x 8 bytes = 384 bytes a token on every rank, whatever tp. Grouped-query
    attention with 4 KV heads of 12 would keep 2 x 4 x 12 values a layer: 2,304 bytes at tp 1, 576 at tp 4."""
    slots = 40 * 4
    for tp in (1, 2, 4):
        for r in range(tp):
            model = PagedModel(weights, TPGroup(tp, r), 40, 4)
            assert model.cache.v is None and model.kv_heads == 1
            assert model.cache.size_bytes == kv_bytes_per_token(3, 4, 12, 8, tp, latent_dim=16) * slots == 384 * slots
            assert torch.equal(model.layers[1].attention.kv_a, weights.layers[1]["kv_a"])  # the latent's weights whole
    gqa = kv_bytes_per_token(3, 4, 12, 8, 1)
    assert gqa == 2304 and kv_bytes_per_token(3, 4, 12, 8, 4) == 576


@pytest.mark.parametrize("world", [1, 2, 4])
def test_on_ranks_exact_and_every_rank_caches_the_whole_latent(weights, generated, world, request):
    ranks = Ranks(1) if world == 1 else request.getfixturevalue(f"pool{world}")
    try:
        config = EngineConfig(block_size=4, num_blocks=14, max_batch_tokens=12)
        run = run_serving(ranks, weights, trace(), config)
        assert run.tokens == generated
        assert run.preemptions > 0 and run.prefix_hit_tokens > 0
        predicted = kv_bytes_per_token(3, 4, 12, 8, world, latent_dim=16) * config.num_blocks * config.block_size
        assert list(run.kv_cache_bytes) == [predicted] * world  # TP copies the latent: the same bytes on every rank
        alone = run_serving(ranks, weights, trace()[3:4], EngineConfig(block_size=4, num_blocks=16))
        assert alone.tokens == {3: generated[3]}
    finally:
        if world == 1:
            ranks.close()


def test_inconsistent_or_unserved_configs_are_refused(hf_model, weights):
    with pytest.raises(ValueError, match="rope_dim 5 is odd"):
        MLAShape(12, 5, 8, 8)
    config = hf_model.config.to_dict()
    inconsistent = r"kv_a_proj_with_mqa is \(16, 32\) but the config's MLA ranks .* make it \(14, 32\)"
    with pytest.raises(ValueError, match=inconsistent):
        weights_from_hf(hf_model.state_dict(), {**config, "kv_lora_rank": 10})  # a latent of 10, not the 12 stored
    with pytest.raises(ValueError, match="8 experts in 3 groups, a token on 2 of them"):
        ModelConfig("m", 1, 32, 4, 4, 48, 97, n_experts=8, experts_per_token=4, expert_groups=3, node_limit=2)
    with pytest.raises(ValueError, match="agree only when num_experts_per_tok = 2 x topk_group"):
        weights_from_hf(hf_model.state_dict(), {**config, "num_experts_per_tok": 2})
    with pytest.raises(ValueError, match="normalises its top-k gates"):
        weights_from_hf(hf_model.state_dict(), {**config, "norm_topk_prob": False})
    state = dict(hf_model.state_dict())
    del state["model.layers.2.self_attn.kv_b_proj.weight"]
    with pytest.raises(ValueError, match="layer 2 is incomplete: 'model.layers.2.self_attn.kv_b_proj.weight'"):
        weights_from_hf(state, config)
    from shardlib.lab.serving.disagg import check_split
    with pytest.raises(ValueError, match="caches one latent a token, not K/V heads"):
        check_split(3, 1, weights.config)


@pytest.mark.parametrize("world", [2, 4])
def test_attention_data_parallel_with_experts_spread_caches_each_sequence_on_one_rank(weights, generated, world,
                                                                                      request):
    """DeepSeek-V3's decode layout in miniature: every rank holds every head and runs only its own sequences
    (handed out in turn as they arrive), the experts spread over all the ranks. Predicted: rank r stores the
    latents of the requests it owns, prompt plus every generated token but the last (no preemption here), and no
    other; tensor parallelism stores every request's on every rank. The tokens stay transformers'."""
    ranks = request.getfixturevalue(f"pool{world}")
    config = EngineConfig(block_size=4, num_blocks=80, max_batch_tokens=32, prefix_caching=False)
    dp = run_serving(ranks, weights, trace(), config, dp_attention=True)
    tp = run_serving(ranks, weights, trace(), config)
    assert dp.tokens == tp.tokens == generated and dp.preemptions == tp.preemptions == 0
    stored = [len(r.prompt_token_ids) + r.max_new_tokens - 1 for r in trace()]  # arrival order is id order here
    predicted = [sum(n for i, n in enumerate(stored) if i % world == rank) for rank in range(world)]
    assert list(dp.got.each("cache_entries")) == predicted  # each sequence's latents on its one rank
    assert list(tp.got.each("cache_entries")) == [sum(stored)] * world  # TP: every latent on every rank
    steps, moe_layers = len(dp.steps), 2
    for rank in range(world):  # per step: 3 all-to-alls per MoE layer, one all-gather of the logits at most
        mine = [c for c in dp.got.comm if c.rank == rank]
        assert sum(c.op == "all_to_all_single" for c in mine) == 3 * moe_layers * steps
        assert sum(c.op == "all_reduce" for c in mine) == 0  # whole heads and dense MLPs: nothing to sum
        assert sum(c.op == "all_gather" for c in mine) <= steps


def test_attention_data_parallel_refuses_a_shared_prefix_cache(weights):
    from shardlib.lab.serving.engine_drivers import check_serving

    with pytest.raises(ValueError, match="a prefix cached on one rank cannot serve another's"):
        check_serving(weights, trace(), EngineConfig(), 2, dp_attention=True)


def test_random_weights_of_the_tiny_config_have_transformers_shapes(weights):
    """``random_weights`` draws a DeepSeek-V3 (no transformers): the same keys and shapes as one read from it."""
    from shardlib.core.model import random_weights
    from shardlib.lab.serving.hf import tiny_deepseek_v3

    drawn = random_weights(tiny_deepseek_v3(), seed=1, dtype=torch.float64)
    assert drawn.config == weights.config
    for a, b in zip(drawn.layers, weights.layers):
        assert {k: tuple(t.shape) for k, t in a.items()} == {k: tuple(t.shape) for k, t in b.items()}
