"""The least-squares fit on synthetic timings with a known latency and bandwidth, and the sweep on real ranks."""

import math
import random

import numpy as np
import pytest

from shardlib.facts.hardware import Link
from shardlib.lab.costs.calibration import run_calibration, sweep_on_rank
from shardlib.lab.harness import on_ranks
from shardlib.predict.alpha_beta import (
    DEFAULT_SIZES_BYTES,
    SWEEP_OPS,
    Sample,
    collective_time_s,
    fit_link,
    r_squared,
    slowest_samples,
)
from shardlib.runtime.errors import RankError

TRUE = Link("known", 5e9, 25e-6)  # 25 us per message, 5 GB/s each way
SIZES = [64 * 4 ** k for k in range(9)]  # 64 B .. 4 MiB


def synthetic(noise: float = 0.0, seed: int = 0, charge: str = "per_step") -> list[Sample]:
    rng = random.Random(seed)
    return [Sample(op, n, s, collective_time_s(op, s, n, TRUE, charge) * (1 + rng.uniform(-noise, noise)))
            for op in SWEEP_OPS for n in (2, 4) for s in SIZES]


def test_exact_timings_give_back_the_latency_and_bandwidth():
    fit = fit_link(synthetic())
    assert math.isclose(fit.latency_s, 25e-6, rel_tol=1e-9)
    assert math.isclose(fit.bandwidth_bytes_per_s, 5e9, rel_tol=1e-9)
    assert fit.r_squared > 1 - 1e-12 and fit.median_relative_error < 1e-9
    assert not fit.latency_clamped and fit.n_samples == 54


def test_exact_timings_under_the_per_call_charge():
    fit = fit_link(synthetic(charge="per_call"), latency_charge="per_call")
    assert math.isclose(fit.latency_s, 25e-6, rel_tol=1e-9)
    assert math.isclose(fit.bandwidth_bytes_per_s, 5e9, rel_tol=1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_noisy_timings_still_give_them_back_closely(seed):
    # every time off by up to 5 %, at random: latency within 5 %, bandwidth within 3 %
    fit = fit_link(synthetic(noise=0.05, seed=seed))
    assert abs(fit.latency_s / 25e-6 - 1) < 0.05
    assert abs(fit.bandwidth_bytes_per_s / 5e9 - 1) < 0.03
    assert fit.r_squared > 0.99


def test_the_fitted_link_predicts_with_the_same_formula():
    link = fit_link(synthetic()).link("here")
    assert isinstance(link, Link) and link.name == "here" and link.direction == "per direction"
    assert math.isclose(collective_time_s("all_reduce", 1 << 20, 4, link),
                        collective_time_s("all_reduce", 1 << 20, 4, TRUE))
    assert "R^2" in link.source


def test_a_negative_latency_is_refitted_as_zero():
    # large messages only, each a little faster than S / B would allow: the straight line crosses zero below 0
    samples = [Sample("point_to_point", 2, s, s / 1e9 - 1e-6) for s in (1 << 20, 1 << 22, 1 << 24)]
    fit = fit_link(samples)
    assert fit.latency_clamped and fit.latency_s == 0.0
    assert abs(fit.bandwidth_bytes_per_s / 1e9 - 1) < 0.01


def test_r_squared_by_hand():
    # measured 1, 2, 3 (mean 2, total 2); predicted 1, 2, 4: residual 1 -> R^2 = 1 - 1/2 = 0.5
    assert r_squared(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0])) == 0.5
    assert r_squared(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 1.0


def test_a_sample_is_the_slowest_rank_in_the_fastest_round():
    per_rank = [{("all_reduce", 64): [1.0, 5.0, 2.0], ("point_to_point", 64): [1.0, 1.0, 4.0]},
                {("all_reduce", 64): [4.0, 1.0, 1.0], ("point_to_point", 64): [2.0, 3.0, 2.0]},
                {("all_reduce", 64): [1.0, 1.0, 9.0], ("point_to_point", 64): None}]
    # all-reduce: slowest per round 4, 5, 9 -> fastest round 4
    # point-to-point: ranks 0 and 1 only, slowest per round 2, 3, 4 -> 2
    assert slowest_samples(per_rank, 3) == [Sample("all_reduce", 3, 64, 4.0), Sample("point_to_point", 3, 64, 2.0)]
    # the median round instead: all-reduce 4, 5, 9 -> 5; point-to-point 2, 3, 4 -> 3
    assert slowest_samples(per_rank, 3, "median") == [Sample("all_reduce", 3, 64, 5.0),
                                                      Sample("point_to_point", 3, 64, 3.0)]
    # ranks outside the group report None and are left out: all-reduce 4, 5, 2 -> 4
    assert slowest_samples(per_rank[:2] + [None], 2, "median") == [Sample("all_reduce", 2, 64, 4.0),
                                                                    Sample("point_to_point", 2, 64, 3.0)]


@pytest.mark.parametrize("samples, words", [
    ([Sample("all_reduce", 2, 64, 1e-3)] * 3, "at least 2 different sizes"),
    ([Sample("all_reduce", 2, 64, 1e-3), Sample("all_reduce", 2, 128, 0.0)], "measured times must be positive"),
    ([Sample("all_reduce", 2, s, 1e-3 * (2 - s / 4096)) for s in (64, 1024, 4096)], "do not grow with message size"),
])
def test_fits_that_cannot_be_made_say_why(samples, words):
    with pytest.raises(ValueError, match=words):
        fit_link(samples)


@pytest.mark.parametrize("sizes, words", [
    ([64, 0], r"a message size \(bytes\) must be a whole number of at least 1, got 0"),
    ([64, 100], "a message of 100 bytes cannot be cut into 2 equal float32 pieces"),
    ([], "at least one message size"),
])
def test_bad_sweep_sizes_are_refused_before_anything_runs(pool2, sizes, words):
    with pytest.raises(ValueError, match=words):
        run_calibration(pool2, sizes)


def test_bad_rounds_and_pools_are_refused(pool2):
    with pytest.raises(ValueError, match="rounds must be a whole number of at least 1, got 0"):
        run_calibration(pool2, rounds=0)
    with pytest.raises(ValueError, match="statistic must be one of fastest, median, got 'mean'"):
        run_calibration(pool2, statistic="mean")
    with pytest.raises(ValueError, match="the sweep times some of all_reduce, all_to_all, point_to_point; got"):
        run_calibration(pool2, ops=("broadcast",))
    with pytest.raises(ValueError, match="n_ranks = 4 needs a pool whose size is a multiple of 4; this pool has 2"):
        run_calibration(pool2, n_ranks=4)

    class OneRank:
        world_size = 1

    with pytest.raises(ValueError, match="needs at least 2 ranks, got a pool of 1"):
        run_calibration(OneRank())


def test_the_sweep_on_real_ranks_times_every_op_at_every_size_and_fits_a_link(pool):
    """What the sweep measured and what the fit made of it, in structure: every op at every default size on
    the whole pool, each time a positive number of seconds, one fit per op, a link with a latency of at least
    0 and a positive bandwidth (``fit_link`` refuses or clamps anything else). Whether time grows with size
    and how well the fit explains it is the notebook's claim and the benchmark's."""
    sizes = DEFAULT_SIZES_BYTES
    cal = run_calibration(pool, sizes)
    for op in SWEEP_OPS:
        samples = sorted((s for s in cal.samples if s.op == op), key=lambda s: s.size_bytes)
        assert [s.size_bytes for s in samples] == sorted(sizes), op
        assert all(s.n_ranks == pool.world_size and math.isfinite(s.seconds) and s.seconds > 0 for s in samples)
    assert set(cal.per_op) == set(SWEEP_OPS)
    for fit in (cal.overall, *cal.per_op.values()):
        assert fit.latency_s >= 0 and math.isfinite(fit.bandwidth_bytes_per_s) and fit.bandwidth_bytes_per_s > 0
    assert f"{pool.world_size} ranks" in cal.link.name


def test_a_sweep_round_is_recorded_through_ctx_comm(pool2):
    points = (("all_reduce", 64, 3), ("all_to_all", 256, 2), ("point_to_point", 1024, 1))
    got = on_ranks(pool2, sweep_on_rank, points, repeats=2)
    for rank in (0, 1):  # in the order of the points; a ping-pong is a send and a recv each way
        logged = [(r.op, r.size_bytes) for r in got.records(rank=rank)]
        ping_pong = [("send", 1024), ("recv", 1024)][::1 - 2 * rank]  # rank 1 receives first
        assert logged == [("all_reduce", 64)] * 3 + [("all_to_all_single", 256)] * 2 + ping_pong  # no barriers
    bursts = got.spans("burst")  # one span a point, on both ranks, with what it timed
    assert sorted((s.rank, s.attrs["op"], s.attrs["size_bytes"]) for s in bursts) == sorted(
        (rank, op, size) for rank in (0, 1) for op, size, _ in points)


def test_a_sweep_on_the_first_ranks_of_a_larger_pool(pool4):
    sizes = (64, 2 ** 20, 2 ** 22)  # up to 4 MiB: time grows with size well above the scheduler's noise
    cal = run_calibration(pool4, sizes, rounds=3, n_ranks=2, statistic="median", ops=("all_reduce", "point_to_point"))
    assert {(s.op, s.n_ranks) for s in cal.samples} == {("all_reduce", 2), ("point_to_point", 2)}
    assert set(cal.per_op) == {"all_reduce", "point_to_point"}
    got = on_ranks(pool4, sweep_on_rank, (("all_reduce", 64, 2),), 2)  # a round of the sweep on the first 2 ranks
    reduces = got.records("all_reduce")
    assert {r.rank for r in reduces} == {0, 1} and {r.group for r in reduces} == {"tp"}  # ranks 2 and 3 sat out
    link = cal.op_link("all_reduce")
    assert link.name == "this machine (gloo, 2 ranks, all-reduce)"
    assert link.latency_s == cal.per_op["all_reduce"].latency_s
    with pytest.raises(ValueError, match="this calibration fitted all_reduce, point_to_point; got 'all_to_all'"):
        cal.op_link("all_to_all")


def test_a_group_that_does_not_divide_the_pool_is_named_on_the_rank(pool4):
    with pytest.raises(RankError, match="a group of the first 3 ranks needs a pool whose size is a multiple of 3"):
        on_ranks(pool4, sweep_on_rank, (("all_reduce", 64, 1),), 3)
