"""Tensor parallelism: the splits, the pair in one process, and MLP/attention on real ranks.

Tolerances: wherever partial results are summed across shards (the all-reduce), float32 addition in a
different order changes the last bits, so outputs are compared with ``atol=1e-5`` (values here are of
order 1). Splitting alone involves no arithmetic and is compared exactly.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardlib import RankError
from shardlib.models import LLAMA_3_70B, LLAMA_3_8B, MIXTRAL_8X7B, TOY, check_tensor_parallel
from shardlib.tensor_parallel import (CUTS, TensorParallelPair, max_tensor_parallel_shards, pair_collectives,
                                      shard_columns, shard_rows)
from shardlib.tp_ranks import (attention_reference, mlp_reference, pair_column_then_row, pair_row_then_column,
                               toy_block_weights, tp_attention, tp_mlp)

ATOL = 1e-5


@pytest.mark.parametrize("n_shards", [2, 4, 8])
def test_a_sharded_pair_computes_what_the_unsharded_one_does(n_shards):
    torch.manual_seed(0)
    first, second = nn.Linear(64, 128, bias=False), nn.Linear(128, 64, bias=False)
    x = torch.randn(3, 5, 64)
    assert torch.allclose(second(first(x)), TensorParallelPair(first, second, n_shards=n_shards)(x), atol=ATOL)


@pytest.mark.parametrize("n_shards", [1, 2, 3, 4, 8])
def test_odd_shapes_biases_and_an_activation(n_shards):
    torch.manual_seed(1)
    first, second = nn.Linear(30, 96), nn.Linear(96, 7)  # 96 divides 1, 2, 3, 4 and 8 ways
    x = torch.randn(2, 9, 30)
    pair = TensorParallelPair(first, second, n_shards, activation=F.gelu)
    assert torch.allclose(second(F.gelu(first(x))), pair(x), atol=ATOL)


def test_the_row_bias_is_added_once_after_the_sum():
    torch.manual_seed(2)
    first, second = nn.Linear(8, 16), nn.Linear(16, 4)
    pair = TensorParallelPair(first, second, 4)
    x = torch.randn(5, 8)
    partials = sum(pair.shard_output(x, i) for i in range(4))
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
    (lambda: TensorParallelPair(nn.Linear(4, 8), nn.Linear(6, 4), 2), "first produces 8 features but second expects 6"),
    (lambda: TensorParallelPair(nn.Linear(4, 10), nn.Linear(10, 4), 4), "10 output features cannot be split 4 ways"),
])
def test_bad_splits_say_which_rule_broke(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_the_kv_head_wall():
    assert [max_tensor_parallel_shards(m) for m in (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY)] == [8, 8, 8, 4]
    assert LLAMA_3_70B.usable_tp == [1, 2, 4, 8] and TOY.usable_tp == [1, 2, 4]
    with pytest.raises(ValueError, match="8 KV heads cannot be split 16 ways: tensor parallelism gives each "
                                         "device whole KV heads"):
        check_tensor_parallel(LLAMA_3_70B, 16)
    with pytest.raises(ValueError, match=r"8 KV heads cannot be split 3 ways.*32 query heads cannot be split 3 ways"
                                         r".*d_ff = 14336 cannot be split 3 ways.*Usable tp for Llama-3-8B: \[1, 2, 4, 8\]"):
        check_tensor_parallel(LLAMA_3_8B, 3)
    with pytest.raises(ValueError, match="at least 1"):
        check_tensor_parallel(TOY, 0)
    check_tensor_parallel(TOY, 4)  # allowed: no error


# -- on real ranks ----------------------------------------------------------------------------------
def _reference_grads(fn, x, weights, grad):
    x = x.clone().requires_grad_()
    ws = [w.clone().requires_grad_() for w in weights]
    out = fn(x, *ws)
    out.backward(grad)
    return out.detach(), x.grad, [w.grad for w in ws]


def test_tp_mlp_forward_and_backward_match_the_reference(pool):
    w = toy_block_weights(3)
    n = pool.world_size
    ref, ref_gx, (g_gate, g_up, g_down) = _reference_grads(mlp_reference, w["x"], [w["gate"], w["up"], w["down"]], w["grad"])
    results = pool.run(tp_mlp, w["x"], w["gate"], w["up"], w["down"], w["grad"])
    for r, res in enumerate(results):
        assert torch.allclose(res["output"], ref, atol=ATOL)
        assert torch.allclose(res["grad_x"], ref_gx, atol=ATOL)
        assert torch.allclose(res["grad_gate"], g_gate.chunk(n, 0)[r], atol=ATOL)
        assert torch.allclose(res["grad_up"], g_up.chunk(n, 0)[r], atol=ATOL)
        assert torch.allclose(res["grad_down"], g_down.chunk(n, 1)[r], atol=ATOL)
        # Megatron's g forward and f backward: one all-reduce of (batch, seq, d_model) floats each
        assert (res["forward_collectives"], res["backward_collectives"]) == (1, 1)
        assert res["forward_bytes"] == res["backward_bytes"] == 2 * 6 * 32 * 4


def test_tp_attention_forward_and_backward_match_the_reference(pool):
    w = toy_block_weights(4)
    n = pool.world_size
    fn = lambda x, q, k, v, o: attention_reference(x, q, k, v, o, 8, 4)  # noqa: E731
    ref, ref_gx, (gq, gk, gv, go) = _reference_grads(fn, w["x"], [w["q"], w["k"], w["v"], w["o"]], w["grad"])
    results = pool.run(tp_attention, w["x"], w["q"], w["k"], w["v"], w["o"], 8, 4, w["grad"])
    for r, res in enumerate(results):
        assert torch.allclose(res["output"], ref, atol=ATOL)
        assert torch.allclose(res["grad_x"], ref_gx, atol=ATOL)
        for name, full, dim in (("grad_q", gq, 0), ("grad_k", gk, 0), ("grad_v", gv, 0), ("grad_o", go, 1)):
            assert torch.allclose(res[name], full.chunk(n, dim)[r], atol=ATOL), name
        assert (res["forward_collectives"], res["backward_collectives"]) == (1, 1)


def test_tp_attention_refuses_to_split_kv_heads(pool4):
    w = toy_block_weights(5, kv=2)
    with pytest.raises(RankError, match="2 KV heads cannot be split 4 ways"):
        pool4.run(tp_attention, w["x"], w["q"], w["k"], w["v"], w["o"], 8, 2)


def test_the_other_cut_needs_a_second_collective_and_more_bytes(pool):
    w = toy_block_weights(6)
    x, w1, w2 = w["x"], w["up"], w["down"]  # d_model 32 -> d_ff 64 -> 32
    ref = F.linear(F.gelu(F.linear(x, w1)), w2)
    right, other = pool.run(pair_column_then_row, x, w1, w2), pool.run(pair_row_then_column, x, w1, w2)
    tokens = 2 * 6
    for res in right + other:
        assert torch.allclose(res["output"], ref, atol=ATOL)
    assert all(res["collectives"] == [("all_reduce", tokens * 32 * 4)] for res in right)
    assert all(res["collectives"] == [("all_reduce", tokens * 64 * 4), ("all_gather", tokens * 32 * 4)] for res in other)


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
    w = toy_block_weights(7)
    ours = pool2.run(pair_column_then_row, w["x"], w["up"], w["down"])
    theirs = pool2.run(_dtensor_pair, w["x"], w["up"], w["down"])
    for a, b in zip(ours, theirs):
        assert torch.allclose(a["output"], b, atol=ATOL)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_predicted_collectives_by_hand(n):
    # 10 tokens, d_model 16, hidden 64, 4-byte values: output 10*16*4 = 640 bytes, intermediate 2560 bytes
    right, other = pair_collectives(CUTS[0], n, 10, 16, 64), pair_collectives(CUTS[1], n, 10, 16, 64)
    if n == 1:
        assert right == other == []
    else:
        assert right == [("all_reduce", 640)] and other == [("all_reduce", 2560), ("all_gather", 640)]
    with pytest.raises(ValueError, match="cut must be one of"):
        pair_collectives("diagonal", n, 10, 16, 64)


def test_the_cut_explorer_sets_measured_beside_predicted(pool2):
    from shardlib.widgets import tp_cut_explorer

    app = tp_cut_explorer(pool2)
    shards, cut, out = app.children
    assert "(matches)" in out.value
    cut.value = CUTS[1]
    assert "2 collective(s)" in out.value and "(matches)" in out.value
    shards.value = 99  # the slider clamps to its range
    assert shards.value == 8 and "set shards to 2" in out.value


def test_the_wall_picker_explains_refusals():
    from shardlib.widgets import tp_wall_picker

    model, degree, out = tp_wall_picker().children
    degree.value = 16
    assert "refused" in out.value and "8 KV heads cannot be split 16 ways" in out.value
    model.value = "toy"
    degree.value = 4
    assert "allowed" in out.value and "[1, 2, 4]" in out.value
