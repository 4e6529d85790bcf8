"""The measured claims of notebook 00, on a pool: a collective waits for its slowest rank
(``run_straggler_check``), a failing rank is reported at once and the pool recovers (``run_failure_check``),
and an all-reduce's time at a given size (``run_all_reduce_time``), each claim a ``lab.verdict.Verdict``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

from shardlib.core.checks import one_per, whole_number
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.intro.ranks import all_reduce_on_rank, straggler_on_rank
from shardlib.lab.verdict import Verdict, verified
from shardlib.runtime.errors import RankError

WAIT_BAND = (0.8, 1.25)  # measured wait / predicted wait
REPORT_LIMIT_S = 2.0  # a failed rank is reported within this


def _waits_s(got: Measured) -> list[tuple[float, float]]:
    """Per run: (rank 1's arrival - rank 0's, on the shared clock; rank 0's seconds inside the all-reduce
    - rank 1's)."""
    waits = []
    for i in range(len(got.times_s[0])):
        arrived = [got.spans("matmuls", rank, i)[0].end_s for rank in (0, 1)]
        inside = [got.records("all_reduce", rank, i)[0].duration_s for rank in (0, 1)]
        waits.append((arrived[1] - arrived[0], inside[0] - inside[1]))
    return waits


@dataclass(frozen=True)
class StragglerCheck:
    """Rank 0's predicted and measured wait inside the all-reduce (medians over the runs), the last run's
    spans for a timeline and their origin, and the verdict."""

    predicted_wait_s: float
    measured_wait_s: float
    spans: tuple
    started_s: float
    verdicts: tuple[Verdict, ...] = ()


def run_straggler_check(ranks, work_units=(1, 4), runs: int = 5, attempts: int = 3) -> StragglerCheck:
    """``straggler_on_rank`` ``runs`` times on 2 ranks, rank 1 with more work. Prediction: rank 0 waits
    inside the all-reduce for as long as rank 1 arrives after it; the medians must agree within
    ``WAIT_BAND``. A busy machine spoils runs, so they are taken again, at most ``attempts`` times."""
    one_per(list(work_units), ranks.world_size, "work_units", "rank")
    whole_number(runs, "runs")
    if ranks.world_size != 2 or not work_units[1] > work_units[0]:
        raise ValueError(f"the straggler check needs 2 ranks, rank 1 with more work than rank 0; got "
                         f"{ranks.world_size} ranks with work {tuple(work_units)}")

    def measure() -> StragglerCheck:
        got = on_ranks(ranks, straggler_on_rank, list(work_units), repeats=runs)
        waits = _waits_s(got)
        return StragglerCheck(statistics.median(p for p, _ in waits), statistics.median(m for _, m in waits),
                              got.spans(), min(times[-1][0] for times in got.times_s))

    def verdicts(r: StragglerCheck) -> list[Verdict]:
        return [Verdict("rank 0's wait inside the all-reduce", max(r.predicted_wait_s, 1e-9), r.measured_wait_s,
                        "s", *WAIT_BAND)]

    result, found = verified(measure, verdicts, attempts)
    return replace(result, verdicts=found)


@dataclass(frozen=True)
class AllReduceTime:
    """Every rank's all-reduces of one buffer, float32, read as the slowest rank's median seconds."""

    size_bytes: int
    seconds: float


def run_all_reduce_time(ranks, n_elements: int, repeats: int = 5) -> AllReduceTime:
    """An all-reduce of ``n_elements`` float32 values on every rank, ``repeats`` times, each after a barrier."""
    got = on_ranks(ranks, all_reduce_on_rank, n_elements, repeats=repeats)
    return AllReduceTime(got.first(), max(statistics.median(r.duration_s for r in got.records("all_reduce", rank, None))
                                          for rank in got.ranks))


@dataclass(frozen=True)
class FailureCheck:
    """A failing rank function's error, how soon it came, and whether the pool recovered."""

    error: RankError
    reported_after_s: float
    recovered: bool  # the next call on the pool ran on every rank
    verdicts: tuple[Verdict, ...] = ()


def run_failure_check(ranks, fn: Callable, attempts: int = 3) -> FailureCheck:
    """Time how long the pool takes to report ``fn``'s error (within ``REPORT_LIMIT_S``, where a hang would
    never end), then check that it answers again on every rank."""

    def measure() -> FailureCheck:
        started = time.perf_counter()
        try:
            ranks.run(fn)
        except RankError as err:
            elapsed_s = time.perf_counter() - started
            recovered = ranks.run(lambda ctx: ctx.rank) == list(range(ranks.world_size))
            return FailureCheck(err, elapsed_s, recovered)
        raise ValueError(f"{getattr(fn, '__name__', fn)} raised on no rank: the failure check needs a rank "
                         "function that fails")

    def verdicts(r: FailureCheck) -> list[Verdict]:
        return [Verdict(f"reporting rank {r.error.rank}'s error (at most)",
                        REPORT_LIMIT_S, r.reported_after_s, "s", low=1e-9, high=1.0)]

    result, found = verified(measure, verdicts, attempts)
    return replace(result, verdicts=found)
