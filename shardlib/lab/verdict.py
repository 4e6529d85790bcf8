"""A measured claim as a learner reads it: one line, predicted, measured, their ratio and a verdict.

``Verdict`` is one prediction set beside one measurement, with the band the ratio must fall in; its
one-sided form (``at_least`` or ``at_most``, in the measured value's units) claims a bound instead, and
its line says which: "predicted 80x, measured 20x; claimed at least 2x: holds".
``verified(measure, verdicts)`` measures until every verdict holds (at most ``attempts`` times: a busy
machine slows a run, it never speeds one up), then reports: when strict (``strict_checks``: nbval, CI) a
verdict that never held raises ``AssertionError`` with its numbers; for a learner it prints them with a
sentence instead of a traceback. A library driver calls ``verified``; a learner's cell prints the lines
the driver returns and reads how they were measured (``how_measured``) in a folded block. A fit that a
busy machine left nothing to fit to is measured again (``refitted``). No ranks.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Callable, Sequence, TypeVar

T = TypeVar("T")


def _format(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    if unit == "%":
        return f"{value:.1%}"
    if unit == "x":
        return f"{value:.3g}x"
    return f"{value:.3g}{(' ' + unit) if unit else ''}"


@dataclass(frozen=True)
class Verdict:
    """``what`` (a phrase: "the bubble at m = 4") predicted as ``predicted`` and measured as ``measured``,
    in ``unit`` ("s", "%", "" or any word); it holds when ``low <= measured / predicted <= high``.

    One-sided (``at_least`` or ``at_most`` given, in ``unit``): the claim is a bound on the measured value
    itself, ``measured >= at_least`` (or ``<= at_most``), and the prediction is shown for scale; a band
    given beside it (``low``, ``high``) must hold too. ``Verdict.one_sided`` builds one with no band."""

    what: str
    predicted: float
    measured: float
    unit: str = "s"
    low: float = 0.5
    high: float = 2.0
    attempts: int = 1
    at_least: float | None = None
    at_most: float | None = None

    def __post_init__(self):
        if not self.predicted > 0:
            raise ValueError(f"{self.what}: a prediction must be positive to be set beside a measurement, "
                             f"got {self.predicted}")
        if not 0 <= self.low <= 1 <= self.high:
            raise ValueError(f"{self.what}: the band {self.low}..{self.high} must contain 1")
        if self.attempts < 1:
            raise ValueError(f"{self.what}: attempts must be at least 1, got {self.attempts}")
        for name, bound in (("at_least", self.at_least), ("at_most", self.at_most)):
            if bound is not None and not math.isfinite(bound):
                raise ValueError(f"{self.what}: {name} must be a finite number, got {bound}")
        if self.at_least is not None and self.at_most is not None and self.at_least > self.at_most:
            raise ValueError(f"{self.what}: at least {self.at_least} and at most {self.at_most} leave nothing")

    @classmethod
    def one_sided(cls, what: str, predicted: float, measured: float, unit: str = "s", *,
                  at_least: float | None = None, at_most: float | None = None,
                  within: float | None = None) -> "Verdict":
        """A claim that ``measured`` is at least ``at_least`` (or at most ``at_most``), the prediction shown
        for scale; with ``within``, the ratio must also stay within ``within`` times the prediction, either way."""
        if at_least is None and at_most is None:
            raise ValueError(f"{what}: a one-sided claim needs at_least or at_most")
        if within is not None and not within >= 1:
            raise ValueError(f"{what}: within must be at least 1 (a ratio either way), got {within}")
        low, high = (0.0, math.inf) if within is None else (1 / within, within)
        return cls(what, predicted, measured, unit, low, high, at_least=at_least, at_most=at_most)

    @property
    def one_sided_claim(self) -> bool:
        return self.at_least is not None or self.at_most is not None

    @property
    def banded(self) -> bool:
        """Whether the ratio has a band to keep (always for a two-sided verdict)."""
        return self.low > 0 or math.isfinite(self.high)

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted

    @property
    def held(self) -> bool:
        return (self.low <= self.ratio <= self.high
                and (self.at_least is None or self.measured >= self.at_least)
                and (self.at_most is None or self.measured <= self.at_most))

    def _claim(self) -> str:
        parts = []
        if self.at_least is not None:
            parts.append(f"at least {_format(self.at_least, self.unit)}")
        if self.at_most is not None:
            parts.append(f"at most {_format(self.at_most, self.unit)}")
        return " and ".join(parts)

    @property
    def line(self) -> str:
        measured = f"{self.what}: predicted {_format(self.predicted, self.unit)}, measured "
        if not self.one_sided_claim:
            verdict = "as predicted" if self.held else "not shown this time"
            return f"{measured}{_format(self.measured, self.unit)}, ratio {self.ratio:.2f}: {verdict}"
        verdict = "holds" if self.held else "not shown this time"
        band = f", ratio {self.ratio:.2f}" if self.banded else ""
        return f"{measured}{_format(self.measured, self.unit)}{band}; claimed {self._claim()}: {verdict}"

    @property
    def how_measured(self) -> str:
        kept = f"attempt {self.attempts} of at most 3 kept"
        if not self.one_sided_claim:
            return f"{self.what}: passes when measured / predicted is within {self.low:g}-{self.high:g}; {kept}"
        band = f", and measured / predicted within {self.low:g}-{self.high:g}" if self.banded else ""
        return f"{self.what}: passes when measured is {self._claim()}{band}; {kept}"


def verified(measure: Callable[[], T], verdicts: Callable[[T], Sequence[Verdict]],
             attempts: int = 3) -> tuple[T, tuple[Verdict, ...]]:
    """``(result, its verdicts)``: ``measure()`` run until every one of ``verdicts(result)`` holds, at most
    ``attempts`` times; the last run is kept. A verdict that never held fails when strict (``strict_checks``) and is
    explained to a learner otherwise."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        result = measure()
        found = tuple(replace(v, attempts=attempt) for v in verdicts(result))
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


def refitted(fit: Callable[[int], T], attempts: int = 3) -> T:
    """``fit(attempt)``, attempt 1, 2, ..., until one returns. A short sweep on a busy machine can give times
    that do not grow with size, and its fit raises ``ValueError`` (no bandwidth to fit): it is measured again,
    at most ``attempts`` times; the last attempt's error is raised."""
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, got {attempts}")
    for attempt in range(1, attempts + 1):
        try:
            return fit(attempt)
        except ValueError:
            if attempt == attempts:
                raise


def strict_checks() -> bool:
    """Whether a timing claim that did not hold must fail: what whoever runs the notebooks said in
    ``SHARDLIB_STRICT_CLAIMS`` (1: the notebooks' conftest under nbval, ``make busy-check``; 0 or unset: a
    learner's kernel, the browser test's). The library never guesses it from its surroundings."""
    return os.environ.get("SHARDLIB_STRICT_CLAIMS", "").strip().lower() in ("1", "true", "yes")

