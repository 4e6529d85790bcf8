"""A measured claim as a learner reads it: one line, predicted, measured, their ratio and a verdict.

``Verdict`` is one prediction set beside one measurement, with the band the ratio must fall in.
``verified(measure, verdicts)`` measures until every verdict holds (at most ``attempts`` times: a busy
machine slows a run, it never speeds one up), then reports: under a test run or CI a verdict that never
held raises ``AssertionError`` with its numbers; for a learner it prints them with a sentence instead of a
traceback. A library driver calls ``verified``; a learner's cell prints the lines the driver returns and
reads how they were measured (``how_measured``) in a folded block. Pure: no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

from shardlib.runtime.measure import strict_checks

T = TypeVar("T")


def _format(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit == "%":
        return f"{value:.1%}"
    return f"{value:.3g}{(' ' + unit) if unit else ''}"


@dataclass(frozen=True)
class Verdict:
    """``what`` (a phrase: "the bubble at m = 4") predicted as ``predicted`` and measured as ``measured``,
    in ``unit`` ("s", "%", "" or any word); it holds when ``low <= measured / predicted <= high``."""

    what: str
    predicted: float
    measured: float
    unit: str = "s"
    low: float = 0.5
    high: float = 2.0
    attempts: int = 1

    def __post_init__(self):
        if not self.predicted > 0:
            raise ValueError(f"{self.what}: a prediction must be positive to be set beside a measurement, "
                             f"got {self.predicted}")
        if not 0 < self.low <= 1 <= self.high:
            raise ValueError(f"{self.what}: the band {self.low}..{self.high} must contain 1")
        if self.attempts < 1:
            raise ValueError(f"{self.what}: attempts must be at least 1, got {self.attempts}")

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted

    @property
    def held(self) -> bool:
        return self.low <= self.ratio <= self.high

    @property
    def line(self) -> str:
        verdict = "as predicted" if self.held else "not shown this time"
        return (f"{self.what}: predicted {_format(self.predicted, self.unit)}, measured "
                f"{_format(self.measured, self.unit)}, ratio {self.ratio:.2f}: {verdict}")

    @property
    def how_measured(self) -> str:
        return (f"{self.what}: passes when measured / predicted is within {self.low:g}-{self.high:g}; "
                f"attempt {self.attempts} of at most 3 kept")


def verified(measure: Callable[[], T], verdicts: Callable[[T], Sequence[Verdict]],
             attempts: int = 3) -> tuple[T, tuple[Verdict, ...]]:
    """``(result, its verdicts)``: ``measure()`` run until every one of ``verdicts(result)`` holds, at most
    ``attempts`` times; the last run is kept. A verdict that never held fails under a test run or CI and is
    explained to a learner otherwise."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        result = measure()
        found = tuple(Verdict(v.what, v.predicted, v.measured, v.unit, v.low, v.high, attempt)
                      for v in verdicts(result))
        if all(v.held for v in found):
            break
    failed = [v for v in found if not v.held]
    if failed:
        text = ("\n".join(v.line for v in failed) + f"\nAfter {attempt} attempts the timings still disagree. On a "
                "shared machine that almost always means other programs took the cores while the cell measured. "
                "Close what you can and run the cell again.")
        if strict_checks():
            raise AssertionError(text)
        print(text)
    return result, found
