"""Tensor parallelism: the splits, the pair in one process, and MLP/attention on real ranks.

Tolerances: wherever partial results are summed across shards (the all-reduce), float32 addition in a
different order changes the last bits, so outputs are compared with ``atol=1e-5`` (values here are of
order 1). Splitting alone involves no arithmetic and is compared exactly.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    shard_columns,
    shard_rows,
)
from shardlib.core.toy import activations, layer_weights, stack_weights
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY
from shardlib.lab.tensor_parallel.drivers import (
    pair_column_then_row_on_rank,
    pair_in_one_process,
    run_pair,
    run_tp_block,
    tp_block_on_rank,
    tp_stack_in_one_process,
)
from shardlib.predict.shapes import check_tensor_parallel, usable_tensor_parallel_degrees
from shardlib.predict.tensor_parallel import (
    CUTS,
    other_cut_ratios,
    pair_collectives,
    pair_wire_collectives,
)
from shardlib.runtime.errors import RankError

ATOL = 1e-5
# Heads, KV heads, d_ff and vocabulary that divide 2, 3, 4 and 8 ways: for the single-process simulation.
DIVISIBLE = ModelConfig("divisible", n_layers=2, d_model=96, n_heads=48, n_kv_heads=24, d_ff=192, vocab_size=96,
                        bytes_per_param=4.0)


@pytest.mark.parametrize("n_shards", [2, 4, 8])
def test_a_sharded_pair_computes_what_the_unsharded_one_does(n_shards):
    torch.manual_seed(0)
    first, second = nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False)
    x = torch.randn(3, 5, 64)
    assert torch.allclose(second(first(x)), pair_in_one_process(x, first.weight, second.weight, n_shards), atol=ATOL)


@pytest.mark.parametrize("n_shards", [1, 2, 3, 4, 8])
def test_odd_shapes_biases_and_an_activation(n_shards):
    torch.manual_seed(1)
    first, second = nn.Linear(30, 96), nn.Linear(96, 7)  # 96 divides 1, 2, 3, 4 and 8 ways
    x = torch.randn(2, 9, 30)
    pair = pair_in_one_process(x, first.weight, second.weight, n_shards, first.bias, second.bias, F.gelu)
    assert torch.allclose(second(F.gelu(first(x))), pair, atol=ATOL)


def test_the_row_bias_is_added_once_after_the_sum():
    torch.manual_seed(2)
    first, second = nn.Linear(8, 16), nn.Linear(16, 4)
    x = torch.randn(5, 8)
    partials = pair_in_one_process(x, first.weight, second.weight, 4, first.bias)
    assert torch.allclose(partials + second.bias, second(first(x)), atol=ATOL)
    assert not torch.allclose(partials + 4 * second.bias, second(first(x)), atol=1e-3)


def test_shards_are_slices_that_reassemble_exactly():
    w = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)  # (out=6, in=4)
    cols, rows = shard_columns(w, 3), shard_rows(w, 2)
    assert [tuple(c.shape) for c in cols] == [(2, 4)] * 3 and [tuple(r.shape) for r in rows] == [(6, 2)] * 2
    assert torch.equal(torch.cat(cols, 0), w) and torch.equal(torch.cat(rows, 1), w)
    assert torch.equal(cols[1], w[2:4]) and torch.equal(rows[1], w[:, 2:])


@pytest.mark.parametrize("call, words", [
    (lambda: shard_columns(torch.zeros(100, 8), 3), "100 output features cannot be split 3 ways"),
    (lambda: shard_rows(torch.zeros(8, 10), 4), "10 input features cannot be split 4 ways"),
    (lambda: shard_columns(torch.zeros(8, 8), 0), "at least 1"),
    (lambda: shard_rows(torch.zeros(8, 8), -2), "at least 1"),
    (lambda: shard_rows(torch.zeros(8, 8), 2.0), "at least 1"),
    (lambda: shard_rows(torch.zeros(2, 8, 8), 2), "expected an \\(out, in\\) weight"),
    (lambda: pair_in_one_process(torch.zeros(4), torch.zeros(8, 4), torch.zeros(4, 6), 2),
     "w1 produces 8 features but w2 expects 6"),
    (lambda: pair_in_one_process(torch.zeros(4), torch.zeros(10, 4), torch.zeros(4, 10), 4),
     "10 output features cannot be split 4 ways"),
])
def test_bad_splits_say_which_rule_broke(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_the_kv_head_wall_is_a_cost():
    # past the KV-head count each KV head is copied (vLLM); the query heads are the last wall
    models = (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY)
    assert [max(usable_tensor_parallel_degrees(m)) for m in models] == [32, 64, 32, 8]
    assert usable_tensor_parallel_degrees(LLAMA_3_70B) == [1, 2, 4, 8, 16, 32, 64]
    assert usable_tensor_parallel_degrees(TOY) == [1, 2, 4, 8]
    check_tensor_parallel(LLAMA_3_70B, 16, copy_kv_heads=True)  # allowed, with copies
    # code on ranks that splits real weights copies no KV heads: its check keeps the strict rule
    with pytest.raises(ValueError, match="8 KV heads cannot be split 16 ways: this code gives each device whole KV "
                                         r"heads and copies none.*Usable tp for Llama-3-70B: \[1, 2, 4, 8\]"):
        check_tensor_parallel(LLAMA_3_70B, 16)
    with pytest.raises(ValueError, match=r"8 KV heads cannot be shared by 3 devices: tp must divide the KV heads"
                                         r".*32 query heads cannot be split 3 ways"
                                         r".*d_ff = 14336 cannot be split 3 ways"
                                         r".*Usable tp for Llama-3-8B: \[1, 2, 4, 8, 16, 32\]"):
        check_tensor_parallel(LLAMA_3_8B, 3, copy_kv_heads=True)
    with pytest.raises(ValueError, match="at least 1"):
        check_tensor_parallel(TOY, 0)
    check_tensor_parallel(TOY, 4)  # allowed: no error


# -- the blocks in one process ---------------------------------------------------------------------
@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_the_blocks_simulated_in_one_process_equal_the_unsharded_stack(tp):
    """The very blocks the ranks run, every rank's partial computed here and summed (attention and MLP
    of two whole transformer blocks): equal to the unsharded stack within float32 rounding."""
    layers = stack_weights(DIVISIBLE, seed=1)
    x = activations(2, 5, DIVISIBLE.d_model, seed=2)
    got = tp_stack_in_one_process(x, layers, DIVISIBLE, tp)
    assert torch.allclose(got, stack_reference(x, layers, DIVISIBLE), atol=ATOL)


def test_one_shard_is_the_reference_bit_for_bit():
    layers = stack_weights(TOY, seed=1)
    x = activations(2, 5, TOY.d_model, seed=2)
    assert torch.equal(tp_stack_in_one_process(x, layers, TOY, 1), stack_reference(x, layers, TOY))


# -- on real ranks ----------------------------------------------------------------------------------
W = layer_weights(TOY, seed=3)  # d_model 64, 8 query heads sharing 4 KV heads, d_ff 256
X, GRAD = activations(2, 6, TOY.d_model, seed=4), activations(2, 6, TOY.d_model, seed=5)


@pytest.mark.parametrize("part", ["mlp", "attention"])
def test_tp_blocks_forward_and_backward_match_the_reference(pool, part):
    run = run_tp_block(pool, part, X, W, TOY, GRAD)
    assert run.output_gap < ATOL and run.grad_x_gap < ATOL
    # Megatron's g forward and f backward: one all-reduce of (batch, seq, d_model) floats each, per rank
    assert run.forward_collectives == run.backward_collectives == (1,) * pool.world_size
    assert run.forward_bytes == run.backward_bytes == (2 * 6 * TOY.d_model * 4,) * pool.world_size
    # each rank's weight gradients are its slices of the full ones: rows of column-parallel matrices,
    # columns of the row-parallel one (down, o)
    names = {"mlp": {"gate", "up", "down"}, "attention": {"q", "k", "v", "o"}}[part]
    assert all(set(grads) == names for grads in run.weight_grads) and run.weight_grads_close and run.exact


def test_tp_attention_refuses_to_split_kv_heads(pool4):
    two_kv = ModelConfig("two KV heads", n_layers=1, d_model=64, n_heads=8, n_kv_heads=2, d_ff=256, vocab_size=512)
    w = layer_weights(two_kv, seed=5)
    with pytest.raises(ValueError, match="2 KV heads cannot be split 4 ways"):
        run_tp_block(pool4, "attention", X, w, two_kv)  # the driver refuses before any rank starts
    with pytest.raises(RankError, match="2 KV heads cannot be split 4 ways"):
        pool4.run(tp_block_on_rank, "attention", X, w, two_kv)  # called straight on the ranks: an error, not a hang


def test_the_other_cut_needs_a_second_collective_and_more_bytes(pool):
    x, w1, w2 = X, W["up"], W["down"]  # d_model 64 -> d_ff 256 -> 64
    right, other = run_pair(pool, CUTS[0], x, w1, w2), run_pair(pool, CUTS[1], x, w1, w2)
    tokens = 2 * 6
    assert right.output_gap < ATOL and other.output_gap < ATOL
    assert right.measured == right.predicted == (("all_reduce", tokens * 64 * 4),)
    assert other.measured == other.predicted == (("all_reduce", tokens * 256 * 4), ("all_gather", tokens * 64 * 4))
    n = pool.world_size  # on the wire, per rank, under the ring: 2(n-1)/n of an all-reduce, (n-1)/n of an all-gather
    assert right.measured_wire == right.predicted_wire == (("all_reduce", 2 * (n - 1) * tokens * 64 * 4 // n),)
    assert other.measured_wire == other.predicted_wire == (("all_reduce", 2 * (n - 1) * tokens * 256 * 4 // n),
                                                           ("all_gather", (n - 1) * tokens * 64 * 4 // n))
    ratios = other_cut_ratios(64, 256)
    assert other.measured_bytes / right.measured_bytes == ratios["buffer"] == 5.0
    assert other.measured_wire_bytes / right.measured_wire_bytes == ratios["wire"] == 4.5


def _layers_pair(ctx, x, w1, b1, w2, b2, grad_output):
    """The textbook pair from the layers themselves: column-parallel (f inside), GELU, row-parallel (g)."""
    tpg = TPGroup.world(ctx)
    first, second = ColumnParallelLinear(w1, b1, tpg), RowParallelLinear(w2, b2, tpg)
    x = x.clone().requires_grad_()
    out = second(F.gelu(first(x)))
    n_forward = len(ctx.comm.records)
    out.backward(grad_output)
    return out.detach(), x.grad, n_forward, len(ctx.comm.records) - n_forward


def test_the_column_and_row_parallel_layers_make_the_pair_with_one_all_reduce_each_way(pool2):
    g = torch.Generator().manual_seed(8)
    w1, b1, w2, b2 = (torch.randn(*shape, generator=g) / shape[-1] ** 0.5
                      for shape in ((256, 64), (256,), (64, 256), (64,)))
    x_ref = X.clone().requires_grad_()
    reference = F.linear(F.gelu(F.linear(x_ref, w1, b1)), w2, b2)
    reference.backward(GRAD)
    for out, grad_x, n_forward, n_backward in pool2.run(_layers_pair, X, w1, b1, w2, b2, GRAD):
        assert torch.allclose(out, reference.detach(), atol=ATOL)  # the row bias added once, after the sum
        assert torch.allclose(grad_x, x_ref.grad, atol=ATOL)
        assert (n_forward, n_backward) == (1, 1)  # g forward, f backward


def _dtensor_pair(ctx, x, w1, w2):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = nn.Sequential(nn.Linear(w1.shape[1], w1.shape[0], bias=False), nn.GELU(),
                          nn.Linear(w2.shape[1], w2.shape[0], bias=False))
    with torch.no_grad():
        model[0].weight.copy_(w1)
        model[2].weight.copy_(w2)
    mesh = init_device_mesh("cpu", (ctx.world_size,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    # The output is an asynchronous all-reduce's tensor: the runtime must wait for it before sending it
    # back (a bare detach does not), or the parent would receive one rank's un-summed partial.
    return model(x)


def test_peer_check_pytorch_dtensor_agrees(pool2):
    """PyTorch's own ColwiseParallel/RowwiseParallel, on the same ranks, computes the same pair."""
    w = layer_weights(TOY, seed=7)
    ours = pool2.run(pair_column_then_row_on_rank, X, w["up"], w["down"])
    theirs = pool2.run(_dtensor_pair, X, w["up"], w["down"])
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, atol=ATOL)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_predicted_collectives_by_hand(n):
    # 10 tokens, d_model 16, hidden 64, 4-byte values: output 10*16*4 = 640 bytes, intermediate 2560 bytes
    right, other = pair_collectives(CUTS[0], n, 10, 16, 64), pair_collectives(CUTS[1], n, 10, 16, 64)
    if n == 1:
        assert right == other == []
    else:
        assert right == [("all_reduce", 640)] and other == [("all_reduce", 2560), ("all_gather", 640)]
    with pytest.raises(ValueError, match="unknown cut 'diagonal'"):
        pair_collectives("diagonal", n, 10, 16, 64)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_wire_bytes_and_the_ratios_of_the_two_cuts_by_hand(n):
    # 10 tokens, d_model 16, hidden 64: the output's all-reduce 640 buffer bytes, 2(n-1)/n x 640 on the wire
    assert pair_wire_collectives(CUTS[0], n, 10, 16, 64) == [("all_reduce", 1280 * (n - 1) // n)]
    assert pair_wire_collectives(CUTS[1], n, 10, 16, 64) == [("all_reduce", 5120 * (n - 1) // n),
                                                            ("all_gather", 640 * (n - 1) // n)]
    right, other = (sum(b for _, b in pair_wire_collectives(c, n, 10, 16, 64)) for c in CUTS)
    assert other / right == other_cut_ratios(16, 64)["wire"] == 4.5  # the same at every n: (n-1)/n cancels
    assert other_cut_ratios(16, 16) == {"collectives": 2.0, "buffer": 2.0, "wire": 1.5}  # "doubles" in buffers
    assert pair_wire_collectives(CUTS[1], 1, 10, 16, 64) == []
    with pytest.raises(ValueError, match="d_hidden"):
        other_cut_ratios(16, 0)


def test_the_cut_explorer_sets_measured_beside_predicted(pool2):
    from shardlib.ui.tensor_parallel_widgets import tp_cut_explorer

    app = tp_cut_explorer(pool2)
    shards, cut, out, feedback = app.children
    assert "(matches)" in out.value
    cut.value = CUTS[1]
    assert "2 collective(s)" in out.value and "(matches)" in out.value
    shards.value = 99  # the slider clamps to its range
    assert shards.value == 8 and "set shards to 2" in out.value


def test_the_wall_picker_explains_refusals():
    from shardlib.ui.tensor_parallel_widgets import tp_wall_picker

    model, degree, out, feedback = tp_wall_picker().children
    degree.value = 16
    assert "allowed" in out.value and "each copied on 2 GPUs (the KV cache stops shrinking)" in out.value
    assert "KV cache of one 8,192-token sequence 336 MB per GPU" in out.value  # as at tp = 8
    degree.value = 12
    assert "refused" in out.value and "8 KV heads cannot be shared by 12 devices" in out.value
    model.value = "toy"
    degree.value = 4
    assert "allowed" in out.value and "[1, 2, 4, 8]" in out.value and "not a measurement" in out.value


def test_kv_cache_figure_flattens_past_the_kv_heads():
    from shardlib.predict.shapes import kv_cache_bytes
    from shardlib.ui.tensor_parallel_figures import kv_cache_per_gpu_figure

    degrees = (1, 2, 4, 8, 16, 32)
    cache = [kv_cache_bytes(LLAMA_3_70B, 8192, tp=t) for t in degrees]
    fig = kv_cache_per_gpu_figure("Llama-3-70B", 8, degrees, cache, [1e9 / t for t in degrees])
    kv = list(fig.data[1].y)
    assert kv[3] == kv[4] == kv[5] and kv[0] == 8 * kv[3]
    assert "not a measurement" in fig.layout.title.text


def test_the_cut_explorers_answer_in_notebook_01():
    """12 tokens, d_model 32, d_hidden 128: column-then-row sends 1,536, 2,304, 2,688 wire bytes a rank at 2,
    4 and 8 shards, and row-then-column 4.5 times as much at each."""
    for n, right in ((2, 1536), (4, 2304), (8, 2688)):
        sent = [sum(w for _, w in pair_wire_collectives(cut, n, 12, 32, 128)) for cut in CUTS]
        assert sent == [right, right * 9 // 2]
