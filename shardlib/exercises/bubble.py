"""Graders for the served pipeline's exercise (notebook 03): the bubble fraction and a pass's time.

* ``grade_bubble_fraction``: ``(p - 1) / (m + p - 1)``; Megatron-LM's ratio to ideal, ``(p - 1) / m``, is the
  mistake it names most often.
* ``grade_pass_time``: a forward-only pass through equal stages with a hop between neighbours,
  ``(m + p - 1) t + (p - 1) h``: the hops delay the first microbatch's trip, never the ones behind it.
"""

from __future__ import annotations

import math

from shardlib.core.checks import is_number
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.predict.pipeline import pipeline_bubble_fraction

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


def _same_everywhere(wrong: list[tuple[int, int, float]], formula) -> bool:
    """``formula`` gives the learner's value at every point that differs (one point alone can fit
    several: at p = m = 1, p / (m + p - 1) and the busy fraction are both 1)."""
    return all(math.isclose(value, formula(p, m), rel_tol=1e-9, abs_tol=1e-12) for p, m, value in wrong)


@grading.checks(values=2, refuses_bad_input=1)
def grade_bubble_fraction(bubble_fn) -> ExerciseResult:
    """Grade a learner's ``bubble_fraction(n_stages, n_microbatches) -> float`` against
    ``predict.pipeline.pipeline_bubble_fraction`` over a grid of stage and microbatch counts, and check that no
    stages or no microbatches raises ``ValueError``."""
    check_callable(bubble_fn, "bubble_fraction")
    got = Collector("bubble fraction", f"n_stages in {STAGES} x n_microbatches in {MICROBATCHES}, and "
                                       f"n_stages = 0 or n_microbatches = 0 (must raise ValueError)",
                    grade_bubble_fraction.checks)
    wrong = []
    for p in STAGES:
        for m in MICROBATCHES:
            value = grading.call(got, f"p = {p}, m = {m}", bubble_fn, p, m)
            if got.not_written:
                return got.result()
            if value is not None and not is_number(value):
                got.fail(f"p = {p}, m = {m}: return a number, got {type(value).__name__} {value!r}")
            elif value is not None and not _same_everywhere([(p, m, float(value))], pipeline_bubble_fraction):
                wrong.append((p, m, float(value)))
    if wrong:
        p, m, value = wrong[0]
        hint = grading.first_match(wrong, LIKELY_MISTAKES, _same_everywhere) or (
            "picture the schedule: how many microbatch-times does a step last, and for how many is a stage busy?")
        got.fail(f"p = {p} stages, m = {m} microbatches: you returned {value:.4g}, the bubble fraction is "
                 f"{pipeline_bubble_fraction(p, m):.4g}: {hint} ({len(wrong)} of the "
                 f"{len(STAGES) * len(MICROBATCHES)} points differ)")
    for p, m in BAD_INPUTS:
        grading.must_refuse(got, f"p = {p}, m = {m}", bubble_fn, (p, m),
                            "a pipeline needs at least 1 stage and 1 microbatch", check="refuses_bad_input")
    return got.result(f"matches (p - 1) / (m + p - 1) at all {len(STAGES) * len(MICROBATCHES)} points")


# -- a served pass's time, hops included -------------------------------------------------------------------
PASS_POINTS = tuple((p, m, t, h) for p in STAGES for m in MICROBATCHES for t, h in ((0.01, 0.0), (0.025, 0.002)))
PASS_MISTAKES = (  # a learner's likely formulas, each with what it means
    (lambda p, m, t, h: (m + p - 1) * t, "that leaves the hops out: the first microbatch crosses p - 1 of them "
                                         "before the last stage starts"),
    (lambda p, m, t, h: (m + p - 1) * (t + h), "that charges a hop to every slot: only the first microbatch's "
                                               "trip waits on them, the ones behind it arrive while a stage works"),
    (lambda p, m, t, h: (m + p - 1) * t + p * h, "p - 1 boundaries lie between p stages, so p - 1 hops, not p"),
    (lambda p, m, t, h: p * m * t, "stages work at the same time: the pass is not every stage's work in a row"),
)


def _pass_time(p: int, m: int, t: float, h: float) -> float:
    return (m + p - 1) * t + (p - 1) * h


@grading.checks(values=2, refuses_bad_input=1)
def grade_pass_time(pass_fn) -> ExerciseResult:
    """Grade a learner's ``pass_time(n_stages, n_microbatches, stage_s, hop_s) -> float``, the seconds one
    forward-only pass takes through equal stages with a hop between neighbours, over a grid; check that no
    stages or no microbatches raises ``ValueError``."""
    check_callable(pass_fn, "pass_time")
    got = Collector("pass time", f"n_stages in {STAGES} x n_microbatches in {MICROBATCHES}, stages of 10 ms with "
                                 "no hop and of 25 ms with 2 ms hops; and no stages or no microbatches (ValueError)",
                    grade_pass_time.checks)
    wrong = []
    for p, m, t, h in PASS_POINTS:
        value = grading.call(got, f"p = {p}, m = {m}, stage {t * 1e3:g} ms, hop {h * 1e3:g} ms", pass_fn, p, m, t, h)
        if got.not_written:
            return got.result()
        if value is not None and not is_number(value):
            got.fail(f"p = {p}, m = {m}: return a number of seconds, got {type(value).__name__} {value!r}")
        elif value is not None and not math.isclose(float(value), _pass_time(p, m, t, h), rel_tol=1e-9, abs_tol=1e-12):
            wrong.append((p, m, t, h, float(value)))
    if wrong:
        p, m, t, h, value = wrong[0]
        hint = next((why for f, why in PASS_MISTAKES if all(
            math.isclose(v, f(*point), rel_tol=1e-9, abs_tol=1e-12) for *point, v in wrong)), None) or (
            "picture the first microbatch's trip through every stage and hop, then the others leaving one stage-time "
            "apart behind it")
        got.fail(f"p = {p}, m = {m}, stages of {t * 1e3:g} ms, hops of {h * 1e3:g} ms: you returned "
                 f"{value * 1e3:.4g} ms, the pass takes {_pass_time(p, m, t, h) * 1e3:.4g} ms: {hint} ({len(wrong)} "
                 f"of the {len(PASS_POINTS)} points differ)")
    for p, m in BAD_INPUTS:
        grading.must_refuse(got, f"p = {p}, m = {m}", pass_fn, (p, m, 0.01, 0.0),
                            "a pipeline needs at least 1 stage and 1 microbatch", check="refuses_bad_input")
    return got.result(f"matches (m + p - 1) t + (p - 1) h at all {len(PASS_POINTS)} points")
