"""Notebook 00's measured claims: the straggler's wait and a failing rank, each reported as one verdict."""

from types import SimpleNamespace

import pytest

from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.intro import drivers
from shardlib.lab.intro.drivers import run_all_reduce_time, run_failure_check, run_straggler_check
from shardlib.lab.intro.ranks import straggler_on_rank

TWO_RANKS = SimpleNamespace(world_size=2)


def _measured(monkeypatch, *attempts):
    """Each attempt's runs, (predicted, measured) per run, in place of what the ranks would give."""
    batches = iter(attempts)
    runs = Measured((), times_s=(((0.0, 1.0),),) * 2)  # each rank's one repeat: no spans, no records
    monkeypatch.setattr(drivers, "on_ranks", lambda ranks, fn, work, repeats: runs)
    monkeypatch.setattr(drivers, "_waits_s", lambda got: next(batches))


def test_straggler_check_keeps_the_medians_and_measures_again_while_the_wait_disagrees(monkeypatch):
    # the first five runs spoiled (measured twice the prediction), then five good
    _measured(monkeypatch, [(0.010, 0.020)] * 5,
              [(0.010, 0.011), (0.012, 0.012), (0.009, 0.010), (0.011, 0.011), (0.010, 0.009)])
    result = run_straggler_check(TWO_RANKS)
    assert (result.predicted_wait_s, result.measured_wait_s) == (0.010, 0.011)  # the medians of the kept runs
    (v,) = result.verdicts
    assert v.held and v.attempts == 2 and "rank 0's wait inside the all-reduce: predicted 10 ms" in v.line


def test_straggler_check_fails_when_strict_and_the_wait_never_agrees(monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")  # as nbval runs the notebooks
    _measured(monkeypatch, *[[(0.010, 0.030)] * 5] * 3)
    with pytest.raises(AssertionError, match="ratio 3.00: not shown this time"):
        run_straggler_check(TWO_RANKS)


@pytest.mark.parametrize("ranks, work, phrase", [
    (SimpleNamespace(world_size=2), (4, 1), "rank 1 with more work than rank 0"),
    (SimpleNamespace(world_size=2), (1, 4, 2), "work_units"),
    (SimpleNamespace(world_size=2), (1, 4), "runs"),
])
def test_straggler_check_refuses_bad_input_in_the_learners_terms(ranks, work, phrase):
    with pytest.raises(ValueError, match=phrase):
        run_straggler_check(ranks, work, runs=0 if phrase == "runs" else 5)


def fails_on_rank_1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank 1 had a bad day")
    ctx.comm.barrier()


def test_failure_check_names_the_rank_and_the_pool_recovers(pool2):
    result = run_failure_check(pool2, fails_on_rank_1)
    assert result.error.rank == 1 and "bad day" in str(result.error) and result.recovered
    assert "reporting rank 1's error (at most): predicted 2 s" in result.verdicts[0].line


def test_the_straggler_waits_and_the_all_reduce_time_are_read_off_live_ranks(pool2, monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "0")  # a loaded machine may spoil the timing, not the reading
    result = run_straggler_check(pool2, runs=2, attempts=1)
    assert len(result.verdicts) == 1
    assert {s.name for s in result.spans} == {"matmuls", "all_reduce"} and result.started_s > 0
    got = on_ranks(pool2, straggler_on_rank, [1, 4], repeats=2)
    assert len(drivers._waits_s(got)) == 2  # one (predicted, measured) a run
    timing = run_all_reduce_time(pool2, 1024, repeats=3)
    assert timing.size_bytes == 4096 and timing.seconds > 0


def test_failure_check_refuses_a_function_that_does_not_fail(pool2):
    with pytest.raises(ValueError, match="raised on no rank"):
        run_failure_check(pool2, lambda ctx: ctx.rank)
