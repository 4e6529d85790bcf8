"""The measured claims of notebook 00, run on a pool and reported as one line each.

* ``run_straggler_check``: a collective waits for its slowest rank. Rank 0 does less work than rank 1
  (``straggler_on_rank``); the wait rank 0 spends inside the all-reduce is predicted by the difference of
  the two ranks' arrivals, read off the shared timeline.
* ``run_failure_check``: a rank that raises is reported at once (a ``RankError`` naming it), not waited
  on, and the pool starts fresh ranks so the next call works.

Each returns a result whose ``verdicts`` (``lab.verdict``) print as one line: predicted, measured,
ratio, verdict.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

from shardlib.core.checks import one_per, whole_number
from shardlib.lab.intro.ranks import straggler_on_rank
from shardlib.lab.verdict import Verdict, verified
from shardlib.runtime.errors import RankError

WAIT_BAND = (0.8, 1.25)  # measured wait / predicted wait
REPORT_LIMIT_S = 2.0  # a failed rank is reported within this


@dataclass(frozen=True)
class StragglerCheck:
    """Rank 0's predicted and measured wait inside the all-reduce (medians over ``runs``), and the spans
    of the last run for a timeline."""

    work_units: tuple[int, ...]
    runs: int
    predicted_wait_s: float  # median of (rank 1's arrival - rank 0's), on the shared clock
    measured_wait_s: float  # median of (rank 0's all-reduce time - rank 1's)
    spans: tuple = ()
    started_s: float = 0.0  # the last run's start, the timeline's origin
    verdicts: tuple[Verdict, ...] = ()


def _straggler_once(ranks, work_units: list[int]) -> tuple[float, float]:
    """One run: (rank 1's arrival - rank 0's; rank 0's extra seconds inside the all-reduce)."""
    times = ranks.run(straggler_on_rank, work_units)
    arrived = {s.rank: s.end_s for s in ranks.last_spans if s.name == "matmuls"}
    return arrived[1] - arrived[0], times[0].all_reduce_s - times[1].all_reduce_s


def run_straggler_check(ranks, work_units=(1, 4), runs: int = 5, attempts: int = 3) -> StragglerCheck:
    """Rank ``r`` does ``work_units[r]`` units of matmuls, then all ranks all-reduce (``straggler_on_rank``).
    Prediction: rank 0 waits inside the all-reduce for as long as rank 1 arrives after it. The medians of
    ``runs`` runs are compared; the verdict holds when measured / predicted is within 0.8-1.25. A busy
    machine spoils a run (a rank that wakes late from the opening barrier starts late), so the ``runs``
    are taken again, at most ``attempts`` times in all; the last set is kept. Needs 2 ranks, the later
    one with more work."""
    one_per(list(work_units), ranks.world_size, "work_units", "rank")
    whole_number(runs, "runs")
    if ranks.world_size != 2 or not work_units[1] > work_units[0]:
        raise ValueError(f"the straggler check needs 2 ranks, rank 1 with more work than rank 0; got "
                         f"{ranks.world_size} ranks with work {tuple(work_units)}")

    def measure() -> StragglerCheck:
        pairs = [_straggler_once(ranks, list(work_units)) for _ in range(runs)]
        return StragglerCheck(tuple(work_units), runs, statistics.median(p for p, _ in pairs),
                              statistics.median(m for _, m in pairs), tuple(ranks.last_spans),
                              ranks.last_started_s)

    def verdicts(r: StragglerCheck) -> list[Verdict]:
        return [Verdict("rank 0's wait inside the all-reduce", max(r.predicted_wait_s, 1e-9), r.measured_wait_s,
                        "s", *WAIT_BAND)]

    result, found = verified(measure, verdicts, attempts)
    return StragglerCheck(result.work_units, result.runs, result.predicted_wait_s, result.measured_wait_s,
                          result.spans, result.started_s, found)


@dataclass(frozen=True)
class FailureCheck:
    """What a failing rank function produced: the error, how soon it came, and whether the pool recovered."""

    error: RankError
    reported_after_s: float
    recovered: bool  # the next call on the pool ran on every rank
    verdicts: tuple[Verdict, ...] = ()


def run_failure_check(ranks, fn: Callable, attempts: int = 3) -> FailureCheck:
    """Run ``fn``, a rank function that raises on some rank, and time how long the pool takes to report it
    (the verdict: within 2 s, where a hang would never end); then check that the pool answers again on
    every rank. A ``ValueError`` if ``fn`` raises on no rank."""

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
    return FailureCheck(result.error, result.reported_after_s, result.recovered, found)
