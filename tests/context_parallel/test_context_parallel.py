"""Context parallelism in one process: placements, the online-softmax merge, the ring simulated at 2, 3, 4
and 8 ranks against ``scaled_dot_product_attention``, bytes and times predicted, memory formulas.

Exactness: the ring adds the keys' contributions block by block in another order than one softmax
does, so outputs are compared with ``atol = 1e-5`` (values here are of order 1); cutting and joining
shards moves values without arithmetic and is compared with ``torch.equal``.
"""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from shardlib.core.config import ModelConfig
from shardlib.core.context_parallel.online_softmax import (
    Partial,
    block_grads,
    block_partial,
    check_shards,
    merge,
)
from shardlib.core.context_parallel.placement import (
    check_sequence,
    chunks_of_rank,
    gather_sequence,
    positions_of_rank,
    shard_sequence,
)
from shardlib.core.context_parallel.ring import simulate_ring_attention
from shardlib.core.mesh import Layout
from shardlib.core.model import attention
from shardlib.facts.hardware import Link
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B, TOY
from shardlib.lab.context_parallel.drivers import attention_and_grads
from shardlib.predict.context_parallel import (
    AttentionShape,
    causal_work,
    context_parallel_needed,
    device_memory,
    hidden_share,
    imbalance,
    ring_backward_bytes_per_rank,
    ring_bytes_per_rank,
    ring_time_s,
    ring_transfer_s,
    ulysses_bytes_per_rank,
    ulysses_collectives,
)
from shardlib.predict.serving.memory import weights_per_gpu
from shardlib.predict.shapes import kv_cache_bytes, kv_heads_per_device
from shardlib.predict.tensor_parallel import sequence_parallel_bytes_per_rank, toy_block_activation_bytes

ATOL = 1e-5


def qkv(batch, heads, kv_heads, seq, head_dim, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, h, seq, head_dim, generator=g, dtype=dtype) for h in (heads, kv_heads, kv_heads))


# -- placements ------------------------------------------------------------------------------------------
def test_zigzag_gives_each_rank_one_early_and_one_late_chunk():
    assert [chunks_of_rank(r, 4, "zigzag") for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [chunks_of_rank(r, 4) for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert positions_of_rank(1, 2, 8, "zigzag") == [2, 3, 4, 5]
    assert positions_of_rank(0, 2, 8, "zigzag") == [0, 1, 6, 7]
    assert positions_of_rank(1, 2, 8) == [4, 5, 6, 7]


@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_shard_then_gather_is_the_identity_and_shards_hold_their_positions(placement, world_size):
    seq = 2 * world_size * 3
    t = torch.arange(2 * seq, dtype=torch.float32).reshape(1, 2, seq, 1)
    shards = shard_sequence(t, world_size, placement)
    assert torch.equal(gather_sequence(shards, placement), t)
    for r, shard in enumerate(shards):
        assert shard[0, 0, :, 0].tolist() == [float(p) for p in positions_of_rank(r, world_size, seq, placement)]


def test_a_sequence_that_does_not_split_is_refused_with_its_numbers():
    with pytest.raises(ValueError, match=r"100 tokens does not split evenly into 3 ranks: 100 = 3 x 33 \+ 1"):
        check_sequence(100, 3)
    with pytest.raises(ValueError, match=r"2 x 4 = 8 chunks .* 12 = 8 x 1 \+ 4"):
        check_sequence(12, 4, "zigzag")
    with pytest.raises(ValueError, match="unknown placement 'striped'"):
        check_sequence(16, 2, "striped")
    assert check_sequence(12, 4) == 3 and check_sequence(16, 4, "zigzag") == 2


def test_causal_work_contiguous_is_a_staircase_and_zigzag_is_flat():
    # contiguous, 4 ranks: rank r meets r whole past blocks and its own diagonal
    work = causal_work(32, 4)
    assert [(w.visible, w.diagonal, w.skipped) for w in work] == [(0, 1, 3), (1, 1, 2), (2, 1, 1), (3, 1, 0)]
    assert imbalance(work) == pytest.approx(4 * 4 / 10)  # the busiest 4 blocks against a mean of 2.5
    # zigzag, 4 ranks (8 chunks of 4 tokens): every rank 2 diagonals and 2 x 3 + 1 visible pairs
    zig = causal_work(32, 4, "zigzag")
    assert {(w.visible, w.diagonal) for w in zig} == {(7, 2)}
    assert imbalance(zig) == 1.0
    # the same number of score entries are needed either way: the useful ones are s (s + 1) / 2 per head
    assert sum(w.scores for w in zig) == 4 * 9 * 16 and sum(w.scores for w in work) == 10 * 64
    # non-causal: everybody meets everything, 2 query chunks x 8 key chunks
    assert {w.computed_pairs for w in causal_work(32, 4, "zigzag", causal=False)} == {16}


# -- the online softmax ----------------------------------------------------------------------------------
def test_a_block_partial_is_attention_over_that_block():
    q, k, v = qkv(2, 4, 2, 7, 5)
    part = block_partial(q, k, v)
    assert torch.allclose(part.out, attention(q, k, v, causal=False), atol=ATOL)
    scores = (q @ k.repeat_interleave(2, dim=1).transpose(-1, -2)) / math.sqrt(5)
    assert torch.allclose(part.row_max, scores.amax(-1), atol=ATOL)
    assert torch.allclose(part.log_sum_exp, scores.logsumexp(-1), atol=ATOL)
    diag = block_partial(q, k, v, diagonal=True)
    assert torch.allclose(diag.out, attention(q, k, v), atol=ATOL)


def test_merging_two_halves_of_the_keys_gives_attention_over_all_of_them():
    q, k, v = qkv(1, 3, 3, 10, 4, seed=1)
    kk, vv = torch.cat([k, 3 * k], dim=2), torch.cat([v, -v], dim=2)  # the second half scores far higher
    halves = [block_partial(q, kk[:, :, s], vv[:, :, s]) for s in (slice(0, 10), slice(10, 20))]
    both = F.scaled_dot_product_attention(q, kk, vv)
    for a, b in (halves, halves[::-1]):
        merged = merge(a, b)
        assert torch.allclose(merged.out, both, atol=ATOL)
    # a plain average of the two halves is not attention: the merge must weigh them
    assert not torch.allclose((halves[0].out + halves[1].out) / 2, both, atol=1e-2)


def test_merge_keeps_exp_finite_for_huge_scores():
    """The running max is what keeps exp from overflowing: scores of 1000 and 2000 merge to the right
    answer, where exp(score) alone would be inf."""
    out = torch.ones(1, 1, 1, 2)
    a = Partial(out, torch.tensor([[[1000.0]]]), torch.tensor([[[1.0]]]))
    b = Partial(-out, torch.tensor([[[2000.0]]]), torch.tensor([[[1.0]]]))
    merged = merge(a, b)
    assert torch.isfinite(merged.out).all() and torch.allclose(merged.out, -out)
    assert merged.row_max.item() == 2000.0 and merged.row_sum.item() == pytest.approx(1.0)


# -- the ring, simulated -----------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [2, 3, 4, 8])
@pytest.mark.parametrize("placement", ["contiguous", "zigzag"])
@pytest.mark.parametrize("causal", [True, False])
def test_the_simulated_ring_equals_whole_sequence_attention(world_size, placement, causal):
    seq = 2 * world_size * 5  # 5 tokens a chunk: not a power of two
    q, k, v = qkv(2, 6, 3, seq, 12, seed=world_size)  # GQA: 2 query heads per KV head; head_dim 12
    ring = simulate_ring_attention(q, k, v, world_size, causal, placement)
    assert (ring - attention(q, k, v, causal=causal)).abs().max() <= ATOL


def test_the_simulated_ring_is_exact_in_float64():
    q, k, v = qkv(1, 4, 1, 48, 8, dtype=torch.float64)
    gap = (simulate_ring_attention(q, k, v, 4, True, "zigzag") - attention(q, k, v)).abs().max()
    assert gap < 1e-12


def test_mismatched_shapes_are_refused_with_their_numbers():
    q, k, v = qkv(1, 4, 2, 8, 8)
    with pytest.raises(ValueError, match=r"q has sequence length 8 but k and v have 6"):
        check_shards(q.shape, k[:, :, :6].shape, v[:, :, :6].shape)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        check_shards(q.shape, k.shape, v[:, :1].shape)
    with pytest.raises(ValueError, match="4 query heads cannot share 3 KV heads"):
        check_shards(q.shape, (1, 3, 8, 8), (1, 3, 8, 8))
    with pytest.raises(ValueError, match=r"q has head_dim 8 but k and v have 4"):
        check_shards(q.shape, (1, 2, 8, 4), (1, 2, 8, 4))
    with pytest.raises(ValueError, match="must be 4-d"):
        check_shards((8, 8), k.shape, v.shape)
    with pytest.raises(ValueError, match="does not split evenly into 3 ranks"):
        simulate_ring_attention(q, k, v, 3)


# -- predictions -------------------------------------------------------------------------------------------
def test_bytes_per_method_hand_worked():
    shape = AttentionShape(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=64, bytes_per_value=2)
    # one K/V block on 4 ranks: 2 x 2 heads x 256 tokens x 64 x 2 bytes = 131,072; the ring sends 3
    assert shape.kv_block_bytes(4) == 131_072
    assert ring_bytes_per_rank(shape, 4) == 3 * 131_072
    # all-to-all: (2 x 8 + 2 x 2) x 256 x 64 x 2 = 655,360 held; 3/4 of it leaves
    assert ulysses_bytes_per_rank(shape, 4) == 0.75 * 655_360
    sizes = [size for _, size, _ in ulysses_collectives(shape, 4)]
    assert sizes == [262_144, 65_536, 65_536, 262_144]
    # the ring's bytes per rank stay near 2 x K/V as ranks are added; the all-to-all's fall like 1/n
    assert ring_bytes_per_rank(shape, 8) > ring_bytes_per_rank(shape, 4)
    assert ulysses_bytes_per_rank(shape, 8) < ulysses_bytes_per_rank(shape, 4)
    # Megatron's sequence parallelism moves exactly tensor parallelism's wire bytes
    both = sequence_parallel_bytes_per_rank(2, 16, 64, 4)
    assert both["tensor parallel"] == both["sequence parallel"] == 2 * 2 * 0.75 * 2 * 16 * 64 * 4


def test_ring_time_overlapped_and_not():
    compute = [0.010, 0.010, 0.004, 0.010]
    assert ring_time_s(compute, 0.006, overlap=True) == pytest.approx(0.010 + 0.010 + 0.006 + 0.010)
    assert ring_time_s(compute, 0.006, overlap=False) == pytest.approx(sum(compute) + 3 * 0.006)
    assert ring_time_s([0.01], 5.0) == 0.01  # one rank: nothing moves
    link = Link("test", 1e9, 1e-4)
    expected = 1e-4 + 2 * 4 * 500 * 10 * 4 / 1e9
    assert ring_transfer_s(AttentionShape(1, 4, 4, 1000, 10), 2, link) == pytest.approx(expected)
    assert hidden_share(0.001, 0.004) == 0.75 and hidden_share(0.01, 0.004) == 0.0
    with pytest.raises(ValueError):
        ring_time_s([], 0.1)


# -- the backward of one block ------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
def test_block_grads_of_the_whole_sequence_equal_sdpa_grads(causal):
    """One block holding every key: FlashAttention-2's backward from the saved output and log-sum-exp
    equals autograd through scaled_dot_product_attention (GQA: a KV head's gradient sums its group)."""
    q, k, v = qkv(2, 6, 2, 10, 12, seed=20)
    d_out = torch.randn_like(q)
    part = block_partial(q, k, v, diagonal=causal)
    delta = (d_out * part.out).sum(-1)
    got = block_grads(q, d_out, part.log_sum_exp, delta, k, v, diagonal=causal)
    for mine, ref in zip(got, attention_and_grads(q, k, v, d_out, causal)[1:]):
        assert torch.allclose(mine, ref, atol=ATOL, rtol=ATOL)


def test_the_rings_backward_bytes_by_hand():
    shape = AttentionShape(1, 8, 2, 1024, 64)  # one K/V block on 4 ranks: 2 x 2 x 256 x 64 x 4 = 256 KiB
    assert shape.kv_block_bytes(4) == 2 ** 18
    assert ring_bytes_per_rank(shape, 4) == 3 * 2 ** 18  # K/V passed on 3 times
    assert ring_backward_bytes_per_rank(shape, 4) == (3 + 4) * 2 ** 18  # K/V 3 times, dK/dV 4 (the last home)
    assert ring_backward_bytes_per_rank(shape, 1) == 0


# -- memory ------------------------------------------------------------------------------------------------
def test_kv_cache_hits_the_kv_head_wall_under_tp_but_not_under_cp():
    # Llama-3-70B, 128k tokens: 2 x 80 layers x 8 KV heads x 128 x 2 bytes x 131072 = 42.9 GB
    whole = kv_cache_bytes(LLAMA_3_70B, 131_072)
    assert whole == 2 * 80 * 8 * 128 * 2 * 131_072
    assert kv_cache_bytes(LLAMA_3_70B, 131_072, tp=8) == whole / 8
    assert kv_cache_bytes(LLAMA_3_70B, 131_072, tp=16) == whole / 8  # each device keeps one whole KV head
    assert kv_cache_bytes(LLAMA_3_70B, 131_072, tp=8, cp=4) == whole / 32
    assert device_memory(LLAMA_3_8B, 8192, tp=2, cp=2).weights_bytes == weights_per_gpu(LLAMA_3_8B, Layout(2, 1))


def attention_activation_bytes(model: ModelConfig, seq: int, batch: int = 1, tp: int = 1, cp: int = 1) -> float:
    """One layer's attention activations on one device: q, k, v and output, plus the score matrix
    (whole with ``cp = 1``, one ring block with ``cp > 1``)."""
    heads = model.n_heads / tp
    qkvo = batch * seq / cp * (2 * heads + 2 * kv_heads_per_device(model, tp)) * model.head_dim
    scores = batch * heads * (seq / cp) ** 2
    return (qkvo + scores) * model.bytes_per_param


def test_attention_activations_shrink_quadratically_with_cp_when_scores_are_held():
    one = attention_activation_bytes(LLAMA_3_8B, 32_768)
    four = attention_activation_bytes(LLAMA_3_8B, 32_768, cp=4)
    scores = 32 * 32_768 ** 2 * 2
    assert one == pytest.approx((32_768 * (2 * 32 + 2 * 8) * 128 + 32 * 32_768 ** 2) * 2)
    assert four == pytest.approx(((32_768 / 4) * (2 * 32 + 2 * 8) * 128 + scores / 2 / 16) * 2)


def test_context_parallel_needed_for_a_long_prompt():
    # Llama-3-8B's weights (16.1 GB) and a million tokens' KV cache (131 GB) on 80 GB devices: cp = 2
    # leaves 65.5 + 16.1 = 81.6 GB per device, just over; cp = 4 fits
    assert device_memory(LLAMA_3_8B, 1_000_000, cp=2).total_bytes > 80e9
    assert context_parallel_needed(LLAMA_3_8B, 1_000_000, 80e9) == 4
    assert context_parallel_needed(LLAMA_3_8B, 8192, 80e9) == 1
    with pytest.raises(ValueError, match="even at cp = 64"):
        context_parallel_needed(LLAMA_3_70B, 8192, 10e9)


def test_toy_block_activation_formula_hand_worked():
    # TOY: d 64, 8 heads of 8, d_ff 256; 2 x 12 = 24 tokens, tp = 2: per token 4 x 64 + 2 (outside and pair
    # inputs) + 4 x 4 x 8 + 4 (attention) + 4 x 128 (MLP) = 902 values
    assert toy_block_activation_bytes(TOY, 2, 12, 2) == 24 * 902 * 4
    # sequence parallel: the norms' inputs and scales are stored once, not twice: 2 x (64 + 1) / 2 per token
    assert toy_block_activation_bytes(TOY, 2, 12, 2, sequence_parallel=True) == 24 * (902 - 65) * 4


def test_attention_bytes_per_rank_hand_worked():
    from shardlib.predict.context_parallel import attention_bytes_per_rank

    shape = AttentionShape(batch=1, heads=8, kv_heads=2, seq=1024, head_dim=64)  # float32
    one = attention_bytes_per_rank(shape)
    assert one == {"q and output rows": 2 * 8 * 1024 * 64 * 4, "own K/V": 2 * 2 * 1024 * 64 * 4,
                   "scores": 8 * 1024 * 1024 * 4}
    ring = attention_bytes_per_rank(shape, 2, "zigzag")  # 4 chunks of 256: one block of scores is 256 x 256
    assert ring["scores"] == 8 * 256 * 256 * 4 and ring["K/V arriving"] == ring["own K/V"] == 2 * 2 * 512 * 64 * 4
    assert sum(ring.values()) < sum(one.values()) / 5
    with pytest.raises(ValueError, match="does not split evenly"):
        attention_bytes_per_rank(AttentionShape(1, 8, 2, 1000, 64), 16)


# -- figures -----------------------------------------------------------------------------------------------
def test_ring_steps_figure_names_whose_block_each_rank_holds():
    from shardlib.ui.context_parallel_figures import ring_steps_figure

    fig = ring_steps_figure(3)
    text = fig.data[0].text
    assert text[0][1].startswith("K/V of rank 2") and text[2][2].startswith("K/V of rank 0")
    assert list(fig.data[0].z[0]) == [1.0, 0.0, 0.0]  # rank 0 computes only its own diagonal block


def test_block_owner_figure_colours_blocks_by_the_computing_rank():
    from shardlib.ui.context_parallel_figures import block_owner_figure

    contiguous, zigzag = block_owner_figure(2).data
    z = [list(row) for row in zigzag.z]  # 4 chunks: rank 0 holds 0 and 3, rank 1 holds 1 and 2
    assert z[0] == [0, None, None, None] and z[3] == [0, 0, 0, 0] and z[2] == [1, 1, 1, None]
    assert [list(row) for row in contiguous.z][3] == [1, 1, 1, 1]
    # the same number of blocks coloured for each rank in the zigzag placement
    assert sum(row.count(0) for row in z) == sum(row.count(1) for row in z) == 5


def test_the_other_figures_draw_their_data():
    from shardlib.runtime.timeline import Span
    from shardlib.ui.context_parallel_figures import (
        attention_memory_figure,
        balance_figure,
        memory_figure,
    )
    from shardlib.ui.data_parallel_figures import overlap_timeline_figure

    fig = memory_figure([1000, 2000], {"tp 8": [1e9, 2e9], "tp 8 x cp 2": [5e8, 1e9]}, 80e9)
    assert [t.name for t in fig.data] == ["tp 8", "tp 8 x cp 2"] and list(fig.data[0].y) == [1.0, 2.0]
    fig = balance_figure({"contiguous": [0.01, 0.02]}, {"contiguous": [1, 3]})
    assert list(fig.data[0].y) == [10.0, 20.0] and list(fig.data[1].y) == [7.5, 22.5]  # 30 ms split 1 : 3
    spans = [Span(0, "attend K/V of rank 0", "compute", 1.0, 1.010),
             Span(0, "send", "comm", 1.0, 1.004, {"size_bytes": 2 ** 20}),
             Span(1, "wait recv", "wait", 1.010, 1.012)]
    fig = overlap_timeline_figure(spans, "t")
    assert {t.name for t in fig.data} == {"compute", "send in flight", "blocked, waiting for the transfer"}
    assert list(fig.layout.yaxis.categoryarray) == ["rank 1 recv", "rank 1 send", "rank 1 compute", "rank 0 recv",
                                                    "rank 0 send", "rank 0 compute"]
    fig = attention_memory_figure({"one": {"scores": 2 ** 20}, "ring": {"scores": 2 ** 18, "own K/V": 2 ** 19}})
    assert [t.name for t in fig.data] == ["scores", "own K/V"] and list(fig.data[1].y) == [0.0, 0.5]


def test_the_ring_hides_its_transfer_from_more_tokens_on_slower_links():
    """Llama-3.1-70B's heads on an H100 at peak: a few hundred tokens per rank over NVLink, thousands over
    InfiniBand; at the threshold the block's attention first outlasts its K/V transfer."""
    from shardlib.facts.hardware import H100_80GB, INFINIBAND_400G, NVLINK
    from shardlib.predict.alpha_beta import point_to_point_s
    from shardlib.predict.context_parallel import ring_block_attention_s, ring_hiding_tokens

    flops = H100_80GB.bf16_flops_per_s
    found = {link.name: ring_hiding_tokens(64, 8, 128, 2, flops, link) for link in (NVLINK, INFINIBAND_400G)}
    assert 100 < found[NVLINK.name] < 1000 < found[INFINIBAND_400G.name] < 10_000
    for link in (NVLINK, INFINIBAND_400G):
        c = found[link.name]
        assert ring_block_attention_s(c, 64, 128, flops) >= point_to_point_s(2 * c * 8 * 128 * 2, link)
        assert ring_block_attention_s(c - 1, 64, 128, flops) < point_to_point_s(2 * (c - 1) * 8 * 128 * 2, link)


def test_all_gather_and_megatron_comm_types_hand_worked():
    from shardlib.predict.context_parallel import (
        CP_COMM_TYPES,
        all_gather_kv_collectives,
        cp_comm_bytes_per_rank,
    )

    shape = AttentionShape(batch=1, heads=8, kv_heads=4, seq=1024, head_dim=64, bytes_per_value=2)
    # gathering K and V: each all-gather's output is 4 heads x 1024 tokens x 64 x 2 bytes = 524,288; 3/4 on the wire
    assert all_gather_kv_collectives(shape, 4) == [("all_gather", 524_288, 393_216)] * 2
    # ... which is the ring's forward bytes: 3 blocks of 2 x 4 x 256 x 64 x 2 = 262,144
    assert cp_comm_bytes_per_rank(shape, 4)["all_gather"] == ring_bytes_per_rank(shape, 4) == 786_432
    assert shape.kv_block_bytes(1) == 1_048_576  # the whole K/V on every rank, for the call
    got = cp_comm_bytes_per_rank(shape, 4, inner=2)
    assert tuple(got) == CP_COMM_TYPES == ("p2p", "all_gather", "a2a", "a2a+p2p")
    assert got["a2a"] == ulysses_bytes_per_rank(shape, 4) == 0.75 * (2 * 8 + 2 * 4) * 256 * 64 * 2
    # a2a+p2p: inside pairs, 1/2 of (2 x 8 + 2 x 4) x 256 x 64 x 2 = 393,216; then a ring of 2 groups, each rank
    # holding 2 KV heads of 512 tokens: 1 block of 2 x 2 x 512 x 64 x 2 = 262,144
    assert got["a2a+p2p"] == 393_216 + 262_144
    # the all-to-all needs the KV heads to divide: 4 KV heads on 8 ranks leave it out
    assert "a2a" not in cp_comm_bytes_per_rank(shape, 8, inner=2)


def _balance(measured, predicted):
    return {p: SimpleNamespace(measured_imbalance=measured[p], predicted_imbalance=predicted[p]) for p in predicted}


def test_the_balance_verdict_holds_exactly_when_zigzag_is_more_even():
    from shardlib.lab.context_parallel.claims import balance_verdicts

    predicted = {"contiguous": 4 / 3, "zigzag": 1.0}
    (held,) = balance_verdicts(_balance({"contiguous": 1.25, "zigzag": 1.05}, predicted))
    assert held.predicted == pytest.approx(0.75) and held.measured == pytest.approx(1.05 / 1.25) and held.held
    (failed,) = balance_verdicts(_balance({"contiguous": 1.1, "zigzag": 1.12}, predicted))
    assert not failed.held  # zigzag measured less even than contiguous: the claim fails
    assert "predicted 0.75" in failed.line and "not shown" in failed.line
