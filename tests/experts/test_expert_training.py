"""Expert parallelism that trains, on 2 and 4 ranks against one process, in float64.

Tolerance: ``EXACT_RTOL`` = 1e-12 relative (the largest difference over the largest value of each
gradient). The forward is bit for bit (fixed blocks of rows, the weighted sum in slot order); the
gradients are sums whose order differs between ranks and one process (rows arrive per source rank,
the all-reduces add ranks pairwise), which float64 rounds at about 1e-16 per term. Routing decisions
and counts are compared exactly.
"""

import pytest
import torch

from shardlib.core.experts.balance import bias_update
from shardlib.core.experts.dispatch import moe_layer
from shardlib.core.experts.routing import GATES, MoEConfig, route
from shardlib.lab.experts.drivers import token_groups
from shardlib.lab.experts.training import (
    BALANCE_CONFIG,
    EXACT_RTOL,
    check_ep_degree,
    make_moe_problem,
    project,
    relative_error,
    run_moe_training,
    train_toy,
)

CFG = MoEConfig(n_experts=8, k=2, d_model=16, d_ff=32)


# -- the layer's forward and its comm log ------------------------------------------------------------------
def _forward_backward(ctx, x, weights, cfg):
    n_local = cfg.n_experts // ctx.world_size
    block = slice(ctx.rank * n_local, (ctx.rank + 1) * n_local)
    experts = [getattr(weights, n)[block].clone().requires_grad_(True) for n in ("gate", "up", "down")]
    home = token_groups(x, ctx.world_size)[ctx.rank]
    h = project(home, weights.w_in.clone().requires_grad_(True))  # the rows need a gradient too
    first = len(ctx.comm.records)
    out = moe_layer(h, weights.router, experts, cfg, ctx=ctx)
    y = out.output
    forward_ops = len(ctx.comm.records) - first
    y.square().sum().backward()
    records = ctx.comm.records[first:]
    return y.detach(), forward_ops, [(r.op, r.size_bytes) for r in records], out.rows_to_rank, out.rows_from_rank


@pytest.mark.parametrize("gate", sorted(GATES))
def test_the_forward_equals_one_process_bit_for_bit(pool, gate):
    cfg = CFG.but(gate=gate)
    problem = make_moe_problem(cfg, 64, skew=1.0)
    w = problem.weights
    got = pool.run(_forward_backward, problem.x, w, cfg)
    with pool.same_threads():
        h = project(problem.x, w.w_in)
        expected = torch.cat([moe_layer(group, w.router, w.experts(), cfg).output
                              for group in token_groups(h, pool.world_size)])
    assert torch.equal(torch.cat([g[0] for g in got]), expected)


def test_the_backward_is_the_reverse_all_to_all_in_the_comm_log(pool):
    """Forward: counts, rows out, rows back. Backward: the rows-back gradient goes out with the dispatch's
    sizes, then the rows-out gradient comes back with the combine's: splits swapped."""
    problem = make_moe_problem(CFG, 64, skew=1.0)
    for _, forward_ops, ops, rows_to, rows_from in pool.run(_forward_backward, problem.x, problem.weights, CFG):
        assert forward_ops == 3
        assert [op for op, _ in ops] == ["all_to_all_single"] * 5
        row_bytes = CFG.d_model * 8
        (_, counts), (_, dispatch), (_, combine), (_, combine_grad), (_, dispatch_grad) = ops
        assert counts == CFG.n_experts * 8
        assert dispatch == sum(rows_to) * row_bytes == combine_grad
        assert combine == sum(rows_from) * row_bytes == dispatch_grad
        assert rows_to != rows_from or pool.world_size == 1  # skewed: a rank does not get back what it sent


# -- the training step: every gradient against one process ---------------------------------------------------
@pytest.mark.parametrize("gate", sorted(GATES))
def test_every_gradient_matches_one_process_with_the_aux_loss(pool, gate):
    cfg = CFG.but(gate=gate, balance="aux-loss")
    run = run_moe_training(pool, make_moe_problem(cfg, 64, skew=1.0), cfg, steps=2)
    assert run.errors["router"] <= EXACT_RTOL and run.errors["w_in"] <= EXACT_RTOL
    assert max(run.errors[n] for n in ("gate", "up", "down")) <= EXACT_RTOL
    assert run.errors["loss"] <= EXACT_RTOL and run.counts_exact and run.copies_agree
    assert run.exact
    assert float(run.trained.grads["router"].abs().max()) > 0  # the router learns through the gates


def test_ep_2_on_4_ranks_reduces_each_expert_over_its_two_copies(pool4):
    cfg = CFG.but(balance="aux-free")
    run = run_moe_training(pool4, make_moe_problem(cfg, 64, skew=1.0), cfg, ep=2, steps=3)
    assert run.exact, run.errors
    assert run.trained.biases[-1].abs().sum() > 0  # the bias moved, the same on every rank


def test_the_expert_gradient_needs_the_expert_data_parallel_sum(pool4):
    """Leave out the sum over the expert-data-parallel group and the gradient is wrong by about half:
    the test of the reduction can fail."""
    cfg = CFG.but(balance="aux-loss")
    problem = make_moe_problem(cfg, 64, skew=1.0)

    def no_edp_sum(ctx, *args):
        original = ctx.comm.all_reduce

        def all_reduce(tensor, op="sum", group=None, async_op=False):
            if group is not None:
                return tensor
            return original(tensor, op, group=group, async_op=async_op)

        ctx.comm.all_reduce = all_reduce
        try:
            return train_toy(ctx, *args)
        finally:
            del ctx.comm.all_reduce

    results = pool4.run(no_edp_sum, problem.x, problem.target, problem.weights, cfg, 2, 1)
    good = run_moe_training(pool4, problem, cfg, ep=2)
    wrong = torch.cat([results[p].grads["up"] for p in range(2)])
    assert relative_error(wrong, good.trained.grads["up"]) > 1e-3


def test_both_balancing_methods_train_exactly_on_ranks_and_balance(pool):
    """From a router that sends most tokens to expert 0, 16 steps of each method (float64, deterministic:
    the same numbers on every machine, so the order of the three is a fact of this toy, not a timing)."""
    problem = make_moe_problem(BALANCE_CONFIG, 128, skew=1.0)
    runs = {b: run_moe_training(pool, problem, BALANCE_CONFIG.but(balance=b), steps=16)
            for b in ("none", "aux-loss", "aux-free")}
    for balance, got in runs.items():
        assert got.exact, (balance, got.max_error)
        assert len(got.trained.counts) == 16 and all(int(step.sum()) == 128 * 2 for step in got.trained.counts)
        assert len(got.trained.task_losses) == 16 and got.trained.task_losses[-1] < got.trained.task_losses[0]
    final = {b: r.trained.max_over_mean[-1] for b, r in runs.items()}
    assert final["aux-free"] < final["aux-loss"] < final["none"], final
    assert runs["aux-free"].trained.biases[0].tolist() == [0.0] * 8
    assert runs["aux-free"].trained.biases[1][0] < 0  # the hot expert's goes down
    aux_loss, aux_free = runs["aux-loss"].trained, runs["aux-free"].trained
    assert aux_loss.losses[-1] > aux_loss.task_losses[-1]  # the auxiliary term is in the loss
    assert aux_free.losses == aux_free.task_losses  # and nothing is added without it


# -- the bias update and bad input (pure) -----------------------------------------------------------------
def test_the_bias_moves_against_the_load_and_not_at_the_mean():
    bias = torch.zeros(4, dtype=torch.float64)
    new = bias_update(bias, torch.tensor([6, 2, 4, 4]), 0.5)
    assert new.tolist() == [-0.5, 0.5, 0.0, 0.0]
    with pytest.raises(ValueError, match="one count per expert"):
        bias_update(bias, torch.tensor([1, 2]), 0.5)


def test_bad_layouts_say_what_is_wrong():
    with pytest.raises(ValueError, match="8 experts cannot be placed on 3 ranks"):
        CFG.experts_per_rank(3)
    with pytest.raises(ValueError, match="ep must divide the world size 4"):
        check_ep_degree(CFG, 4, 3)
    with pytest.raises(ValueError, match="6 experts cannot be placed on 4 ranks"):
        check_ep_degree(CFG.but(n_experts=6), 4, 4)
    with pytest.raises(ValueError, match=r"k \(experts per token\) must be a whole number from 1 to 8, got 9"):
        MoEConfig(n_experts=8, k=9)
    with pytest.raises(ValueError, match="unknown gate"):
        MoEConfig(gate="softmax")


def test_the_gate_functions_and_a_bias_that_chooses_but_never_weighs():
    x = torch.randn(20, CFG.d_model, dtype=torch.float64)
    router = torch.randn(CFG.n_experts, CFG.d_model, dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(CFG.n_experts, dtype=torch.float64)
    bias[3] = 100.0  # every token must now choose expert 3
    for name in GATES:
        cfg = CFG.but(gate=name)
        plain, biased = route(x, router, cfg), route(x, router, cfg, bias)
        assert (biased.experts == 3).any(dim=1).all() and not (plain.experts == 3).any(dim=1).all()
        affinity = GATES[name].affinity(plain.logits)
        assert torch.equal(biased.gates, GATES[name].gates(affinity.gather(1, biased.experts), plain.logits))
        sums = plain.gates.sum(dim=1)
        if name == "softmax-then-topk":  # Switch: the top-k of a softmax over all, not renormalised
            assert (sums < 1).all()
        else:
            assert torch.allclose(sums, torch.ones_like(sums))
        assert not plain.experts.requires_grad and plain.gates.requires_grad


@pytest.mark.parametrize("ep", [2, 4])
def test_each_groups_bytes_are_predicted(pool4, ep):
    """The comm log of one step, summed per (op, group), equals ``predicted_moe_step_bytes``."""
    from shardlib.predict.experts import predicted_moe_step_bytes

    cfg = CFG.but(balance="aux-free")
    got = run_moe_training(pool4, make_moe_problem(cfg, 64, skew=1.0), cfg, ep=ep).got
    row_bytes, sent = CFG.d_model * 8, 64 // 4 * CFG.k  # dropless: every slot of a rank's 16 tokens is sent
    received = []
    for rank in range(4):
        measured = {}
        for r in got.records(rank=rank):
            measured[(r.op, r.group)] = measured.get((r.op, r.group), 0) + r.size_bytes
        _, dispatch, combine, *_ = got.records("all_to_all_single", rank)
        assert dispatch.size_bytes == sent * row_bytes
        received.append(combine.size_bytes // row_bytes)  # the combine sends back the rows this rank received
        assert measured == predicted_moe_step_bytes(8, CFG.d_model, CFG.d_ff, CFG.d_model, ep, 4, sent, received[-1])
    for group in range(4 // ep):  # what a group's ranks received is what they sent: no row lost or made up
        assert sum(received[group * ep:(group + 1) * ep]) == ep * sent
