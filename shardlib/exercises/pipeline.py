"""Grader for the pipeline exercise: the bubble fraction of GPipe / 1F1B, ``(p - 1) / (m + p - 1)``.

Reference: ``pipeline.predict.pipeline_bubble_fraction`` (the idle *fraction* of the step). The other
convention, Megatron-LM's ratio of idle time to ideal compute, ``(p - 1) / m``, is the mistake this
grader names most often.
"""

from __future__ import annotations

import math

from ..checks import is_number
from ..pipeline.predict import pipeline_bubble_fraction
from .result import Collector, ExerciseResult, call, check_callable

STAGES = (1, 2, 3, 4, 8)
MICROBATCHES = (1, 3, 4, 8, 32)
BAD_INPUTS = ((0, 4), (4, 0))  # no stages, no microbatches: must raise ValueError

# Formulas a learner is likely to write instead, each with what it means.
LIKELY_MISTAKES = (
    (lambda p, m: (p - 1) / m, "that is the ratio of idle time to ideal compute, (p - 1) / m (Megatron-LM's "
                               "convention); the fraction of the step spent idle is (p - 1) / (m + p - 1)"),
    (lambda p, m: m / (m + p - 1),
     "that is the busy fraction m / (m + p - 1); the bubble is the idle part, 1 minus it"),
    (lambda p, m: (p - 1) / (m + p), "the step lasts m + p - 1 microbatch-times, not m + p (an off-by-one)"),
    (lambda p, m: p / (m + p - 1), "the fill and drain take p - 1 microbatch-times, not p (an off-by-one)"),
    (lambda p, m: (p - 1) // (m + p - 1), "integer division (//) rounds the fraction down to 0: use /"),
)


def _mistake(wrong: list[tuple[int, int, float, float]]) -> str:
    """The hint whose formula gives the learner's value at every point that differs (one point alone can
    fit several: at p = m = 1, p / (m + p - 1) and the busy fraction are both 1)."""
    for formula, hint in LIKELY_MISTAKES:
        try:
            if all(math.isclose(value, formula(p, m), rel_tol=1e-9, abs_tol=1e-12) for p, m, value, _ in wrong):
                return hint
        except ZeroDivisionError:
            continue
    return "picture the schedule: how many microbatch-times does a step last, and for how many is a stage busy?"


def grade_bubble_fraction(bubble_fn) -> ExerciseResult:
    """Grade a learner's ``bubble_fraction(n_stages, n_microbatches) -> float`` against
    ``pipeline.predict.pipeline_bubble_fraction`` over a grid of stage and microbatch counts, and check that no
    stages or no microbatches raises ``ValueError``."""
    check_callable(bubble_fn, "bubble_fraction")
    got = Collector("bubble fraction", f"n_stages in {STAGES} x n_microbatches in {MICROBATCHES}, and "
                                       f"n_stages = 0 or n_microbatches = 0 (must raise ValueError)")
    wrong = []
    for p in STAGES:
        for m in MICROBATCHES:
            value = call(got, f"p = {p}, m = {m}", bubble_fn, p, m)
            if got.not_written:
                return got.result()
            if value is None:
                continue
            want = pipeline_bubble_fraction(p, m)
            if not is_number(value):
                got.fail(f"p = {p}, m = {m}: return a number, got {type(value).__name__} {value!r}")
            elif not math.isclose(float(value), want, rel_tol=1e-9, abs_tol=1e-12):
                wrong.append((p, m, float(value), want))
    if wrong:
        p, m, value, want = wrong[0]
        got.fail(f"p = {p} stages, m = {m} microbatches: you returned {value:.4g}, the bubble fraction is "
                 f"{want:.4g}: {_mistake(wrong)} ({len(wrong)} of the {len(STAGES) * len(MICROBATCHES)} "
                 f"points differ)")
    for p, m in BAD_INPUTS:
        try:
            value = bubble_fn(p, m)
        except ValueError:
            continue
        except NotImplementedError:
            got.not_written = True
            return got.result()
        except Exception as exc:
            got.fail(f"p = {p}, m = {m}: raise ValueError (a pipeline needs at least 1 stage and 1 microbatch), "
                     f"not {type(exc).__name__}: {exc}")
        else:
            got.fail(f"p = {p}, m = {m}: a pipeline needs at least 1 stage and 1 microbatch, so raise ValueError "
                     f"saying so; you returned {value!r}")
    return got.result(f"matches (p - 1) / (m + p - 1) at all {len(STAGES) * len(MICROBATCHES)} points")
