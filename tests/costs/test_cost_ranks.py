"""Costs shown on real ranks: decode- and prefill-sized all-reduces, one slow rank, replicas vs TP.

No timing is claimed here: the machine is shared and noisy, and the notebook holds the measured-against-
predicted bands (with retries, under nbval) where it can say why; the benchmarks measure. What is checked
does not depend on the clock: which rank was delayed, the calls and their bytes, exactness.
Tolerance: the tensor-parallel MLP stack sums partial outputs across ranks, so it is compared with the
unsharded stack at ``atol=1e-5`` (float32 values of order 1, the sum taken in another order).
"""

import math
import statistics
from collections import Counter

import pytest
import torch

from shardlib.core.model import stack_reference
from shardlib.core.toy import stack_weights
from shardlib.facts.hardware import Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.calibration import sweep
from shardlib.lab.costs.decode_vs_prefill import DecodeVsPrefillRun, run_decode_vs_prefill
from shardlib.lab.costs.replicas import requests, run_replicas_vs_tp, serving_model
from shardlib.lab.costs.slow_rank import SLOW_RANK_OPS, run_slow_rank
from shardlib.predict.alpha_beta import Sample
from shardlib.ui.costs_figures import decode_vs_prefill_table

ATOL = 1e-5
DELAY_S = 0.1
LINK = Link("hand", 1e9, 1e-4)  # 1 GB/s each way, 100 us per ring step


def test_decode_and_prefill_all_reduces_on_the_first_ranks_of_one_pool(pool4):
    run = run_decode_vs_prefill(pool4, LINK, LLAMA_3_8B, tokens=(1, 16), tp_degrees=(2, 4), rounds=2, calls=2)
    assert run.tp_degrees == (2, 4) and run.tokens == (1, 16)
    points = {(tp, t * 4096 * 2) for tp in (2, 4) for t in (1, 16)}
    assert {(s.n_ranks, s.size_bytes) for s in run.floors} == {(s.n_ranks, s.size_bytes) for s in run.medians} == points
    assert all(s.op == "all_reduce" for s in run.floors)
    # the fastest round is a floor under the median round of the same point
    assert all(run.measured_s(tp, t) <= run.measured_s(tp, t, typical=True) for tp in (2, 4) for t in (1, 16))
    run_decode_vs_prefill(pool4, LINK, LLAMA_3_8B, tokens=(1,), tp_degrees=(2,), rounds=1, calls=3)
    reduces = [r for r in pool4.last_comm if r.op == "all_reduce"]  # tp = 2: ranks 0 and 1 alone, logged as "tp"
    assert {r.rank for r in reduces} == {0, 1} and {r.group for r in reduces} == {"tp"}
    assert {r.size_bytes for r in reduces} == {8192}  # one token of Llama-3-8B: 4096 fp16 values
    assert sum(r.rank == 0 for r in reduces) == 6  # the first round runs its 3 calls twice, one untimed


def test_decode_vs_prefill_predictions_by_hand():
    floors = (Sample("all_reduce", 2, 8192, 416e-6), Sample("all_reduce", 2, 16 * 2 ** 20, 30e-3),
              Sample("all_reduce", 4, 8192, 2e-3), Sample("all_reduce", 4, 16 * 2 ** 20, 40e-3))
    medians = tuple(Sample(s.op, s.n_ranks, s.size_bytes, 2 * s.seconds) for s in floors)
    run = DecodeVsPrefillRun(LLAMA_3_8B, LINK, "per_step", (1, 2048), (2, 4), floors, medians)
    # tp = 2, one token: 2 x 100 us + 8,192 B / 1 GB/s = 208.192 us, measured 416 us: 1.998x
    assert run.predicted_terms_s(2, 1) == pytest.approx((200e-6, 8.192e-6))
    assert run.ratio(2, 1) == pytest.approx(416 / 208.192) and run.bound(2, 1) == "latency"
    # tp = 2, 2,048 tokens: 200 us + 16.78 ms = 16.98 ms, bandwidth-bound
    assert run.predicted_s(2, 2048) == pytest.approx(200e-6 + 16 * 2 ** 20 / 1e9) and run.bound(2, 2048) == "bandwidth"
    # tp = 4, one token: 6 x 100 us + 1.5 x 8,192 B / 1 GB/s = 612.3 us, measured 2 ms: 3.27x
    assert run.predicted_s(4, 1) == pytest.approx(600e-6 + 1.5 * 8192 / 1e9)
    assert run.measured_s(4, 1) == 2e-3 and run.measured_s(4, 1, typical=True) == 4e-3
    table = decode_vs_prefill_table(run)  # the fastest round, the median in brackets, the prediction, the ratio
    assert "  2,048   16,777,216" in table and "3.27" in table and "  0.416 ms (  0.832)" in table


@pytest.mark.parametrize("kwargs, words", [
    ({"tp_degrees": (3,)}, "tp = 3 needs a pool whose size is a multiple of 3; this pool has 4 ranks"),
    ({"tp_degrees": (8,)}, "tp = 8 needs a pool whose size is a multiple of 8"),
    ({"tokens": (0,)}, r"tokens \(per message\) must be a whole number of at least 1, got 0"),
    ({"latency_charge": "sometimes"}, "latency_charge must be one of per_step, per_call, got 'sometimes'"),
    ({"rounds": 0}, "rounds must be a whole number of at least 1, got 0"),
])
def test_bad_decode_vs_prefill_arguments_are_refused_before_any_rank_runs(pool4, kwargs, words):
    with pytest.raises(ValueError, match=words):
        run_decode_vs_prefill(pool4, LINK, **kwargs)


def test_a_sweep_runs_each_round_as_its_own_pool_call_every_degree_in_turn(pool4):
    out = sweep(pool4, [("all_reduce", 64, 1), ("all_reduce", 1024, 2), ("point_to_point", 256, 1)], 3, (2, 4))
    assert set(out) == {2, 4} and out[2][2] is None and out[2][3] is None  # ranks 2, 3 sat tp = 2 out
    for n, per_rank in out.items():
        for rank, res in enumerate(per_rank[:n]):
            assert len(res[("all_reduce", 64)]) == len(res[("all_reduce", 1024)]) == 3  # one a round
            assert all(t > 0 for t in res[("all_reduce", 1024)])
            assert (res[("point_to_point", 256)] is None) == (rank > 1)  # the ping-pong is ranks 0 and 1
    # the last pool call: the third round (in order again) at tp = 4, every point once
    assert Counter((r.op, r.size_bytes) for r in pool4.last_comm if r.rank == 0) == {
        ("all_reduce", 64): 1, ("all_reduce", 1024): 2, ("send", 256): 1, ("recv", 256): 1}


@pytest.mark.parametrize("delay_s", [DELAY_S, 0.0])
def test_the_slow_rank_alone_is_throttled_before_every_collective(pool, delay_s):
    """Which rank was delayed, and before which collectives, is read from the spans: no clock involved.
    That the others then wait for it is the notebook's claim (``run_slow_rank_check``) and the benchmark's."""
    slow = pool.world_size - 1
    run = run_slow_rank(pool, slow, delay_s)
    assert (run.slow_rank, run.delay_s, run.ops) == (slow, delay_s, list(SLOW_RANK_OPS))
    for op in run.ops:  # every time a finite number of seconds, one per rank, never negative
        for times in (run.steps_s(op), run.collective_s(op)):
            assert len(times) == pool.world_size and all(math.isfinite(t) and t >= 0 for t in times)
    throttled = [s for s in run.spans if s.name == "throttled"]
    assert {s.rank for s in throttled} == ({slow} if delay_s else set())
    assert len(throttled) == (len(SLOW_RANK_OPS) if delay_s else 0)
    for op, got in run.got.items():  # one call of the collective on every rank, nothing else logged
        assert Counter((r.op, r.rank) for r in got.comm) == {(SLOW_RANK_OPS[op], k): 1 for k in range(pool.world_size)}


@pytest.mark.parametrize("slow_rank, delay_s, words", [
    (5, 0.01, "slow_rank must be a whole number from 0 to 1, got 5"),
    (0, 2.0, r"delay_s \(seconds\) must be a number from 0 to 1, got 2"),
])
def test_a_bad_slow_rank_or_delay_is_named_before_any_rank_runs(pool2, slow_rank, delay_s, words):
    with pytest.raises(ValueError, match=words):
        run_slow_rank(pool2, slow_rank, delay_s)


def test_the_stack_weights_and_requests_are_reproducible():
    model = serving_model(n_layers=2, d_model=8, d_ff=16)
    w1, w2 = stack_weights(model, 3, ("mlp",)), stack_weights(model, 3, ("mlp",))
    assert all(torch.equal(l1[k], l2[k]) for l1, l2 in zip(w1, w2) for k in l1)
    assert [tuple(w1[0][k].shape) for k in ("gate", "up", "down")] == [(16, 8), (16, 8), (8, 16)]
    x = requests(1, 2, 8)
    assert x.shape == (2, 8) and torch.equal(x, requests(1, 2, 8))
    assert not torch.equal(x, requests(2, 2, 8))  # another replica gets other requests
    assert stack_reference(x, w1, model).shape == (2, 8)


def test_replicas_and_one_tensor_parallel_copy_compute_the_same_outputs(pool):
    model = serving_model(n_layers=3, d_model=32, d_ff=64)
    result = run_replicas_vs_tp(pool, LINK, model, batch=2, steps=3)
    assert result.max_output_gap < ATOL
    # rank 0's replica against the stack in one process, on the same requests
    reference = stack_reference(requests(1, 2, 32), stack_weights(model, 0, ("mlp",)), model)  # (batch, d_model)
    assert (result.got.first("replica") - reference).abs().max() < ATOL
    assert len(result.replica_steps_s) == len(result.tp_steps_s) == 3  # the warm-up step left out
    measured, predicted = result.measured, result.predicted
    # the median step of each way, a step ending with the group's slowest rank
    assert measured.world_size == pool.world_size
    assert measured.replica_step_s == statistics.median(result.replica_steps_s)
    assert measured.tp_step_s == statistics.median(result.tp_steps_s)
    assert predicted.world_size == pool.world_size and predicted.tokens_per_step == 2
    assert predicted.replica_step_s == measured.replica_step_s  # the prediction starts from the replicas' step
    # the model's communication: 3 layers x one all-reduce of 2 x 32 float32 = 256 bytes
    n = pool.world_size
    assert result.predicted_comm_s_per_step == pytest.approx(3 * (2 * (n - 1) * 1e-4 + 2 * (n - 1) / n * 256 / 1e9))
    assert predicted.tp_step_s == pytest.approx(measured.replica_step_s / n + result.predicted_comm_s_per_step)
    assert result.tp_all_reduce_s_per_step > 0
    got = result.got  # each rank's all-reduces lie inside its own repeat: their time never exceeds it
    for i in range(1, len(got.times_s[0])):
        for rank in got.ranks:
            inside_s = sum(r.duration_s for r in got.records("all_reduce", rank, i))
            assert 0 < inside_s <= got.elapsed_s(rank)[i]
    from shardlib.ui.costs_figures import replicas_vs_tp_figure

    fig = replicas_vs_tp_figure(result)  # latency and tokens per device, measured beside predicted
    assert [t.name for t in fig.data] == ["measured (median step)"] * 2 + ["predicted"] * 2
    assert list(fig.data[0].y) == [measured.replica_step_s * 1e3, measured.tp_step_s * 1e3]
    assert list(fig.data[3].y) == [predicted.replicas_tokens_per_s_per_device, predicted.tp_tokens_per_s_per_device]


def test_serving_on_two_ranks_of_a_pool_of_four(pool4):
    result = run_replicas_vs_tp(pool4, LINK, serving_model(n_layers=2, d_model=32, d_ff=64), batch=2, steps=2, tp=2)
    assert result.max_output_gap < ATOL and result.measured.world_size == 2 and result.got.ranks == (0, 1)
    reduces = result.got.records("all_reduce", repeat=None)
    # ranks 0 and 1 only, on their "tp" group: 2 layers x (1 warm-up step + 2 steps) all-reduces each
    assert {r.rank for r in reduces} == {0, 1} and {r.group for r in reduces} == {"tp"}
    assert sum(r.rank == 0 for r in reduces) == 6 and {r.size_bytes for r in reduces} == {2 * 32 * 4}


def test_replicas_vs_tp_refuses_a_width_that_does_not_split(pool2):
    with pytest.raises(ValueError, match="d_ff = 33 cannot be split 2 ways"):
        run_replicas_vs_tp(pool2, LINK, serving_model(d_ff=33))
    with pytest.raises(ValueError, match="tp = 4 needs a pool whose size is a multiple of 4; this pool has 2"):
        run_replicas_vs_tp(pool2, LINK, tp=4)


def test_the_slow_rank_explorer_runs_live(pool2):
    from shardlib.ui.costs_widgets import slow_rank_explorer

    box = slow_rank_explorer(pool2, delay_ms=500)
    delay, slow, text, fig, feedback = box.children
    assert delay.value == 200  # clamped to the slider's range
    delay.value = 30
    assert "sleeps 30 ms" in text.value
    assert [t.name for t in fig.figure.data] == ["rank 0", "rank 1 (slow)"]
    assert all(list(t.x) == list(SLOW_RANK_OPS) and all(math.isfinite(y) and y >= 0 for y in t.y)
               for t in fig.figure.data)  # how long rank 0 waited is the notebook's to show
