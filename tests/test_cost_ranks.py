"""Costs shown on real ranks: the traffic of a tensor-parallel pass, one slow rank, replicas vs TP.

Timing claims here use a set delay (a sleep) and generous bands: the machine is shared and noisy.
Tolerance: the tensor-parallel MLP stack sums partial outputs across ranks, so it is compared with the
unsharded stack at ``atol=1e-5`` (float32 values of order 1, the sum taken in another order).
"""

import pytest
import torch

from shardlib import RankError
from shardlib.costs import (SLOW_RANK_OPS, run_replicas_vs_tp, run_slow_rank, run_tp_comm_replay, serving_model,
                            slow_rank_on_rank, tp_forward_cost)
from shardlib.costs.ranks import request_stream
from shardlib.hardware import Link
from shardlib.models import TOY
from shardlib.toy import stack_reference, stack_weights

ATOL = 1e-5
DELAY_S = 0.1


def test_the_replay_issues_exactly_the_collectives_of_a_tp_forward_pass(pool):
    tokens, repeats = 16, 2
    replay = run_tp_comm_replay(pool, TOY, tokens, repeats)
    predicted = tp_forward_cost(TOY, pool.world_size, Link("any", 1e9, 1e-6), tokens)
    for rank in range(pool.world_size):
        reduces = [r for r in pool.last_comm if r.rank == rank and r.op == "all_reduce"]
        assert len(reduces) == 1 + repeats * predicted.collectives  # one warm-up, then 2 per layer per pass
        assert {r.size_bytes for r in reduces} == {predicted.size_bytes}  # 16 tokens x 64 x 4 bytes
    assert predicted.size_bytes == 16 * 64 * 4
    assert len(replay.passes) == repeats and all(t > 0 for t in replay.passes)


def test_every_rank_takes_the_slow_ranks_time(pool):
    slow = pool.world_size - 1
    per_rank = run_slow_rank(pool, slow, DELAY_S).per_rank
    assert all(list(res) == list(SLOW_RANK_OPS) for res in per_rank)
    for op in SLOW_RANK_OPS:
        for rank, res in enumerate(per_rank):
            assert res[op]["step_s"] > 0.8 * DELAY_S, f"rank {rank} finished {op} before the slow rank arrived"
    # a fast rank spends the delay waiting inside the collectives; the slow rank, arriving last, does not
    # (summed over the five collectives: one badly scheduled call on a busy machine cannot decide it)
    budget = 0.5 * len(SLOW_RANK_OPS) * DELAY_S
    for rank, res in enumerate(per_rank):
        inside = sum(res[op]["collective_s"] for op in SLOW_RANK_OPS)
        assert (inside < budget) if rank == slow else (inside > budget), (rank, inside)
    throttled = [s for s in pool.last_spans if s.name == "throttled"]
    assert {s.rank for s in throttled} == {slow} and len(throttled) == len(SLOW_RANK_OPS)


def test_without_a_delay_nobody_waits_that_long(pool2):
    run = run_slow_rank(pool2, 1, 0.0)
    # the same collectives with no delay: the slowest step (median over the ops) far below 0.1 s
    steps = sorted(run.step_s(op) for op in SLOW_RANK_OPS)
    assert steps[len(steps) // 2] < 0.5 * DELAY_S


def test_a_bad_slow_rank_is_named(pool2):
    with pytest.raises(RankError, match="slow_rank must be a whole number from 0 to 1, got 5"):
        pool2.run(slow_rank_on_rank, 5, 0.01)
    assert pool2.run(slow_rank_on_rank, 0, 0.0)[0].keys() == set(SLOW_RANK_OPS)  # the pool recovered


def test_the_stack_weights_and_requests_are_reproducible():
    model = serving_model(n_layers=2, d_model=8, d_ff=16)
    w1, w2 = stack_weights(model, 3, ("mlp",)), stack_weights(model, 3, ("mlp",))
    assert all(torch.equal(l1[k], l2[k]) for l1, l2 in zip(w1, w2) for k in l1)
    assert [tuple(w1[0][k].shape) for k in ("gate", "up", "down")] == [(16, 8), (16, 8), (8, 16)]
    x = request_stream(1, 3, 2, 8)
    assert x.shape == (3, 2, 8) and torch.equal(x, request_stream(1, 3, 2, 8))
    assert not torch.equal(x, request_stream(2, 3, 2, 8))  # another replica gets other requests
    assert stack_reference(x[0], w1, model).shape == (2, 8)


def test_replicas_and_one_tensor_parallel_copy_compute_the_same_outputs(pool):
    result = run_replicas_vs_tp(pool, Link("any", 1e9, 1e-4), serving_model(n_layers=3, d_model=32, d_ff=64),
                                batch=2, steps=3, rounds=1)
    assert result.max_output_gap < ATOL
    assert result.measured.replicas_tokens_per_s > 0 and result.measured.tp_tokens_per_s > 0
    predicted = result.predicted
    assert predicted.world_size == pool.world_size and predicted.tokens_per_step == 2
    # the model's communication: 3 layers x one all-reduce of 2 x 32 float32 = 256 bytes
    from shardlib.ui.cost_figures import replicas_vs_tp_figure

    fig = replicas_vs_tp_figure(result)  # measured beside predicted
    assert list(fig.data[0].y) == [result.measured.replicas_tokens_per_s, result.measured.tp_tokens_per_s]
    assert list(fig.data[1].y) == [predicted.replicas_tokens_per_s, predicted.tp_tokens_per_s]
    assert result.predicted_comm_s_per_step == pytest.approx(
        3 * (2 * (pool.world_size - 1) * 1e-4 + 2 * (pool.world_size - 1) / pool.world_size * 256 / 1e9))


def test_replicas_vs_tp_refuses_a_width_that_does_not_split(pool2):
    with pytest.raises(ValueError, match="d_ff = 33 cannot be split 2 ways"):
        run_replicas_vs_tp(pool2, Link("any", 1e9, 1e-4), serving_model(d_ff=33))


def test_the_slow_rank_explorer_runs_live(pool2):
    from shardlib.ui.cost_widgets import slow_rank_explorer

    box = slow_rank_explorer(pool2, delay_ms=500)
    delay, slow, text, fig, feedback = box.children
    assert delay.value == 200  # clamped to the slider's range
    delay.value = 30
    assert "sleeps 30 ms" in text.value
    assert [t.name for t in fig.data] == ["rank 0", "rank 1 (slow)"]
    assert min(fig.data[0].y) > 15  # rank 0 waited most of the 30 ms in every collective
