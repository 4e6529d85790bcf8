"""The notebook's measured claims as verdicts: each driver's bands worked by hand on made-up results, and
the slow-rank check on real ranks for what does not depend on the clock.

No wall-clock comparison: the verdict functions are pure (numbers in, verdicts out), and the one live check
measures once with ``verified`` replaced, so only what it sets beside what, and which rank slept, is
checked; whether its verdicts hold is the notebook's claim under nbval."""

import math
from types import SimpleNamespace

import pytest

from shardlib.facts.hardware import Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs import slow_rank
from shardlib.lab.costs.calibration import calibration_verdicts
from shardlib.lab.costs.decode_vs_prefill import (
    DecodeVsPrefillRun,
    decode_vs_prefill_verdicts,
    run_decode_vs_prefill_check,
)
from shardlib.lab.costs.replicas import replicas_vs_tp_verdicts
from shardlib.lab.costs.slow_rank import SLOW_RANK_OPS, SlowRankRun, run_slow_rank_check, slow_rank_verdicts
from shardlib.lab.harness import Measured
from shardlib.predict.alpha_beta import Calibration, LinkFit, Sample
from shardlib.predict.serving.replicas import ReplicasVsTensorParallel, replicas_vs_tensor_parallel
from shardlib.runtime.records import CommRecord

LINK = Link("hand", 1e9, 1e-4)  # 1 GB/s each way, 100 us per ring step
KIB, MIB = 2 ** 10, 2 ** 20


def on_the_line(tp: int, size_bytes: int, scale: float = 1.0) -> Sample:
    """An all-reduce exactly on LINK's line (per ring step), times ``scale``."""
    steps = 2 * (tp - 1)
    return Sample("all_reduce", tp, size_bytes, scale * (steps * 1e-4 + steps / tp * size_bytes / 1e9))


def run_of(floors, tokens=(1, 8, 256, 2048), tp_degrees=(2, 4)) -> DecodeVsPrefillRun:
    return DecodeVsPrefillRun(LLAMA_3_8B, LINK, "per_step", tokens, tp_degrees, tuple(floors), tuple(floors))


SIZES = (8 * KIB, 64 * KIB, 2 * MIB, 16 * MIB)  # 1, 8, 256 and 2,048 tokens of Llama-3-8B


def test_points_on_the_line_hold_every_verdict_and_name_what_they_compare():
    run = run_of([on_the_line(tp, s, 1.0 if tp == 2 else 3.0) for tp in (2, 4) for s in SIZES])
    verdicts = decode_vs_prefill_verdicts(run)
    assert all(v.held for v in verdicts), [v.line for v in verdicts]
    whats = [v.what for v in verdicts]
    # 1 and 8 tokens are latency-bound at tp = 2 (200 us against 8 and 66 us of bytes): against the same run
    assert whats[:4] == ["tp = 2, 1 token, against this run's other points",
                         "tp = 2, 8 tokens, against this run's other points",
                         "tp = 2, 256 tokens, against the calibration",
                         "tp = 2, 2,048 tokens, against the calibration"]
    assert "tp = 4: decode, 8 tokens over 1" in whats and "1 token: tp = 4 over tp = 2" in whats
    # on the line, leaving a point out changes nothing: its neighbours predict it exactly
    assert run.neighbours_s(2, 1) == pytest.approx(run.measured_s(2, 1))
    assert verdicts[0].ratio == pytest.approx(1.0)


def test_a_latency_point_is_judged_against_its_own_run_not_an_earlier_calibration():
    # the whole machine got 3.2x slower per message after the calibration: 3.2 x 100 us per ring step now
    floors = [Sample("all_reduce", 2, s, 2 * 3.2e-4 + s / 1e9) for s in SIZES]
    run = run_of(floors, tp_degrees=(2,))
    assert run.ratio(2, 1) == pytest.approx((6.4e-4 + 8192e-9) / (2e-4 + 8192e-9))  # 3.1x the calibration: a miss
    one_token = decode_vs_prefill_verdicts(run)[0]
    assert one_token.held and one_token.ratio == pytest.approx(1.0)  # in line with its neighbours
    # a point out of line with its own run fails whatever the calibration said
    floors[0] = Sample("all_reduce", 2, 8 * KIB, 4 * floors[0].seconds)
    assert not decode_vs_prefill_verdicts(run_of(floors, tp_degrees=(2,)))[0].held


def test_the_relations_are_one_sided_claims_set_beside_the_prediction():
    floors = [on_the_line(tp, s) for tp in (2, 4) for s in SIZES]
    by = {v.what: v for v in decode_vs_prefill_verdicts(run_of(floors))}
    decode = by["tp = 2: decode, 8 tokens over 1"]
    assert decode.predicted == pytest.approx((2e-4 + 65536e-9) / (2e-4 + 8192e-9))
    assert decode.at_most == 4.0 and decode.at_least is None and not decode.banded  # less than 4x: no floor
    assert decode.line.endswith("; claimed at most 4x: holds")
    prefill = by["tp = 2: prefill, 2,048 tokens over 256"]
    assert prefill.at_least == 2.5 and prefill.at_most is None and not prefill.banded  # more than 2.5x
    wider = by["1 token: tp = 4 over tp = 2"]
    assert wider.at_least == 1.0 and math.isinf(wider.high)  # slower, nothing more
    # tp = 4 no faster than tp = 2 on one token: the claim fails, and the line says which claim
    floors[4] = Sample("all_reduce", 4, 8 * KIB, floors[0].seconds * 0.9)
    wider = {v.what: v for v in decode_vs_prefill_verdicts(run_of(floors))}["1 token: tp = 4 over tp = 2"]
    assert not wider.held and wider.line.endswith("; claimed at least 1x: not shown this time")


def test_a_prefill_that_does_not_grow_with_its_bytes_fails():
    floors = [on_the_line(tp, s) for tp in (2, 4) for s in SIZES]
    floors[3] = Sample("all_reduce", 2, 16 * MIB, 2.0 * floors[2].seconds)  # 8x the bytes, 2x the time
    by = {v.what: v for v in decode_vs_prefill_verdicts(run_of(floors))}
    assert not by["tp = 2: prefill, 2,048 tokens over 256"].held


def test_calibration_verdicts_claim_that_bytes_cost_time():
    fit = LinkFit(1e-4, 1e9, 1.0, 0.0, 2)
    samples = (Sample("point_to_point", 2, 64, 1e-4 + 64e-9),
               Sample("point_to_point", 2, 16 * MIB, 1e-4 + 16 * MIB / 1e9))
    cal = Calibration(samples, fit, {"point_to_point": fit})
    (v,) = calibration_verdicts(cal)
    assert v.what == "point-to-point, 16 MiB over 64 B" and v.held
    assert v.predicted == pytest.approx(v.measured) and v.at_least == 2.0 and not v.banded
    # a run far below its fit's growth still shows the claim: bytes cost time, at least 2x
    slow_small = Calibration((Sample("point_to_point", 2, 64, 2e-3), samples[1]), fit, {"point_to_point": fit})
    (v,) = calibration_verdicts(slow_small)
    assert v.held and v.ratio < 0.1
    assert v.line == (f"point-to-point, 16 MiB over 64 B: predicted {v.predicted:.3g}x, measured {v.measured:.3g}x; "
                      "claimed at least 2x: holds")
    flat = Calibration((samples[0], Sample("point_to_point", 2, 16 * MIB, 1.5e-4)), fit, {"point_to_point": fit})
    assert not calibration_verdicts(flat)[0].held  # 16 MiB in 1.5x the time of 64 B: not shown


def slow_run(inside_fast_s: float, inside_slow_s: float, step_s: float, delay_s: float = 0.05) -> SlowRankRun:
    """Rank 1 slow, two collectives: every step ``step_s``, each rank's time inside them split evenly."""
    def measured(op: str) -> Measured:  # one record per rank, inside its one repeat (0 s to step_s)
        inside = (inside_fast_s / 2, inside_slow_s / 2)
        comm = tuple(CommRecord(SLOW_RANK_OPS[op], 4096, s, "world", rank, 0.0) for rank, s in enumerate(inside))
        return Measured((), (), comm, (), (((0.0, step_s),),) * 2)

    return SlowRankRun(1, delay_s, {op: measured(op) for op in ("all_reduce", "barrier")})


def test_slow_rank_verdicts_by_hand():
    steps, waited = slow_rank_verdicts(slow_run(0.1, 0.002, 0.051))
    assert steps.predicted == pytest.approx(0.1) and steps.measured == pytest.approx(0.102) and steps.held
    assert waited.what == "rank 0's wait inside them, beyond rank 1's" and waited.measured == pytest.approx(0.098)
    assert waited.held
    assert not slow_rank_verdicts(slow_run(0.1, 0.09, 0.051))[1].held  # both waited: nobody did the waiting
    assert not slow_rank_verdicts(slow_run(0.1, 0.0, 0.03))[0].held  # steps shorter than the sleep


def test_the_slow_rank_check_on_real_ranks_sets_its_steps_beside_the_sleeps(pool2, monkeypatch):
    """One measurement (``verified`` replaced: its verdicts come back as found, not judged): what each verdict
    sets beside what, and which rank slept. Whether they hold is the notebook's claim under nbval."""
    def measure_once(measure, verdicts, attempts=3):
        result = measure()
        return result, tuple(verdicts(result))

    monkeypatch.setattr(slow_rank, "verified", measure_once)
    run, verdicts = run_slow_rank_check(pool2, 1, 0.05)
    assert run.slow_rank == 1 and run.delay_s == 0.05 and run.ops == list(SLOW_RANK_OPS)
    assert verdicts == slow_rank_verdicts(run)
    steps, waited = verdicts
    assert steps.what == f"the fastest rank's {len(run.ops)} steps"
    assert waited.what == "rank 0's wait inside them, beyond rank 1's"
    assert steps.predicted == waited.predicted == pytest.approx(len(run.ops) * 0.05)
    assert {s.rank for s in run.spans if s.name == "throttled"} == {1}  # which rank slept: no clock
    with pytest.raises(ValueError, match="needs a delay above 0 s"):
        run_slow_rank_check(pool2, 1, 0.0)


def replicas_run(replica_step_s: float, tp_step_s: float, comm_s: float) -> SimpleNamespace:
    """What ``replicas_vs_tp_verdicts`` reads of a run: its measured and predicted steps, on 2 ranks."""
    return SimpleNamespace(measured=ReplicasVsTensorParallel(2, 16, replica_step_s, tp_step_s),
                           predicted=replicas_vs_tensor_parallel(replica_step_s, comm_s, 2, 16))


def test_replicas_vs_tp_verdicts_by_hand():
    # C = 100 ms, T = 5 ms: predicted tp step 55 ms (0.55x), replicas serve 110 / 100 = 1.1x
    step, latency, throughput = replicas_vs_tp_verdicts(replicas_run(0.1, 0.06, 0.005))
    assert step.predicted == pytest.approx(0.055) and step.held
    assert latency.predicted == pytest.approx(0.55) and latency.at_most == 1.0 and latency.held
    assert (latency.low, latency.high) == (0.5, 2.0)  # within 2x of the prediction too
    assert throughput.predicted == pytest.approx(1.1) and throughput.at_least == 1.0
    assert throughput.held  # measured: 0.06 x 2 / 0.1 = 1.2x
    assert latency.line == ("latency per token, tp = 2 over a replica: predicted 0.55x, measured 0.6x, ratio 1.09; "
                            "claimed at most 1x: holds")
    # the split copy slower than a replica: the latency claim fails; faster than half: replicas no longer win
    assert not replicas_vs_tp_verdicts(replicas_run(0.1, 0.11, 0.005))[1].held
    assert not replicas_vs_tp_verdicts(replicas_run(0.1, 0.045, 0.005))[2].held


def test_a_decode_vs_prefill_check_needs_four_token_counts(pool2):
    with pytest.raises(ValueError, match=r"give at least 4 different token counts, got \(1, 2048\)"):
        run_decode_vs_prefill_check(pool2, LINK, tokens=(2048, 1))
