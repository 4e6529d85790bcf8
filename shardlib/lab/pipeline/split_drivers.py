"""The zero-bubble claims of notebook 09 as one-line verdicts: each schedule's step measured on the ranks
beside the prediction of its own list of actions (``simulate``), evaluated with the F, B and W measured
in the same run.

* ``SplitCase``: one schedule to measure (its name, ``m``, and W's cost as a multiple of F's).
* ``run_split_cases``: the cases run on a pool, in order, each a ``SplitStep`` (step and idle share,
  predicted and measured, and whether it equals the one-process model bit for bit); a 1F1B case (whole
  backward, no W of its own) takes its F, B and W from the split case before it with the same W.
* ``split_verdicts``: one ``lab.verdict.Verdict`` per case, on the step time, the band below.
* ``run_zero_bubble_check``: both, measured again while a busy machine spoils a verdict
  (``lab.verdict.verified``), gathered into a ``ZeroBubbleCheck`` whose ``verdicts`` a notebook prints.

The band (``LOW``-``HIGH``, 0.9-1.5) is on the step, not the idle share (a few per cent doubles from a few
milliseconds of overhead); the hand-overs between stages and the Python between ops add about 5-20 % to
ops padded to 20 ms; below 0.9 the list does not describe the run, above 1.5 the ranks waited far beyond.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.registry import SCHEDULE_TITLES, schedule_spec
from shardlib.lab.pipeline.drivers import run_pipeline
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.bubbles import OpCosts, busy_s, op_costs, simulated_fraction

LOW, HIGH = 0.9, 1.5  # measured / predicted step (see the module docstring)


@dataclass(frozen=True)
class SplitCase:
    """Schedule ``name`` with ``n_microbatches`` microbatches, W padded to ``weight_ratio`` times F."""

    name: str
    n_microbatches: int
    weight_ratio: float = 1.0

    def __post_init__(self) -> None:
        schedule_spec(self.name)  # a ValueError listing the schedules for an unknown name
        if self.n_microbatches < 1:
            raise ValueError(f"{self.name}: a step needs at least 1 microbatch, got n_microbatches = "
                             f"{self.n_microbatches}")
        if not self.weight_ratio > 0:
            raise ValueError(f"{self.name}: W's cost is a positive multiple of F's, got weight_ratio = "
                             f"{self.weight_ratio}")

    @property
    def split(self) -> bool:
        return schedule_spec(self.name).split_backward

    @property
    def label(self) -> str:
        w = "" if self.weight_ratio == 1 else f", W = {self.weight_ratio:g} F"
        return f"{SCHEDULE_TITLES[self.name]} step, m = {self.n_microbatches}{w}"


@dataclass(frozen=True)
class SplitStep:
    """One case on the ranks: the F, B and W it was predicted with (``costs``, one action's), the list's
    step and idle share (``predicted_step_s``, ``predicted_idle``), the measured ones, the peak chunks in
    flight per stage, and whether output and gradients equal the one-process model's bit for bit."""

    case: SplitCase
    n_stages: int
    costs: OpCosts
    predicted_step_s: float
    measured_step_s: float
    predicted_idle: float
    measured_idle: float
    peak_in_flight: tuple[int, ...]
    bit_for_bit: bool


@dataclass(frozen=True)
class ZeroBubbleCheck:
    """The cases' ``steps`` (the last round kept) and their ``verdicts``."""

    steps: tuple[SplitStep, ...]
    verdicts: tuple[Verdict, ...]

    def step(self, name: str, n_microbatches: int, weight_ratio: float = 1.0) -> SplitStep:
        for s in self.steps:
            if (s.case.name, s.case.n_microbatches, s.case.weight_ratio) == (name, n_microbatches, weight_ratio):
                return s
        raise ValueError(f"no case {name!r}, m = {n_microbatches}, W = {weight_ratio:g} F was measured; the cases "
                         f"are {[s.case.label for s in self.steps]}")


def _cases(cases) -> tuple[SplitCase, ...]:
    cases = tuple(c if isinstance(c, SplitCase) else SplitCase(*c) for c in cases)
    if not cases:
        raise ValueError("give at least one case to measure, e.g. ('zb-h1', 4, 1.0)")
    for i, case in enumerate(cases):
        if not case.split and not any(c.split and c.weight_ratio == case.weight_ratio for c in cases[:i]):
            raise ValueError(f"{case.label}: a schedule with a whole backward has no W of its own to measure; put a "
                             f"split schedule with W = {case.weight_ratio:g} F before it (e.g. 'zb-h1')")
    return cases


def predicted_step_of(name: str, n_stages: int, n_microbatches: int, costs: OpCosts) -> tuple[float, float]:
    """``(step_s, idle share)`` of schedule ``name``'s own list, played out with one action's ``costs``."""
    schedule = make_schedule(name, n_stages, n_microbatches)
    idle = simulated_fraction(schedule, costs)
    return busy_s(schedule, costs) / (1 - idle), idle


@dataclass(frozen=True)
class SplitRun:
    """The cases' steps, in the order they ran."""

    steps: tuple[SplitStep, ...]


def run_split_cases(ranks, cases, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                    grad_output: torch.Tensor, op_s: float = 0.02) -> SplitRun:
    """Each case run once on ``ranks`` (``ranks.world_size`` stages), F and B padded to ``op_s``, W to
    ``weight_ratio * op_s``; the prediction uses the median F, B and W of the case's own spans."""
    cases = _cases(cases)
    p = ranks.world_size
    out: list[SplitStep] = []
    for case in cases:
        schedule = make_schedule(case.name, p, case.n_microbatches)
        run = run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s,
                           weight_s=case.weight_ratio * op_s)
        if case.split:
            costs = op_costs(run.spans)
        else:
            costs = next(s.costs for s in out if s.case.split and s.case.weight_ratio == case.weight_ratio)
        step_s, idle = predicted_step_of(case.name, p, case.n_microbatches, costs)
        out.append(SplitStep(case, p, costs, step_s, run.bubble.window_s, idle, run.bubble.idle_fraction,
                             run.peak_in_flight, run.against_reference().bit_for_bit))
    return SplitRun(tuple(out))


def split_verdicts(steps) -> tuple[Verdict, ...]:
    """One verdict per step: the list's step predicted, the step measured beside it, within ``LOW``-``HIGH``."""
    return tuple(Verdict(s.case.label, s.predicted_step_s, s.measured_step_s, "s", LOW, HIGH) for s in steps)


def run_zero_bubble_check(ranks, cases, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor, op_s: float = 0.02) -> ZeroBubbleCheck:
    """Measure ``cases`` (``SplitCase`` or ``(name, m, weight_ratio)`` tuples) on ``ranks`` until every
    verdict holds, at most three rounds; a verdict that never held fails when strict. A step that
    differs from the one-process model raises at once: that is a bug, not a busy machine."""
    cases = _cases(cases)

    def measure() -> tuple[SplitStep, ...]:
        steps = run_split_cases(ranks, cases, model, layers, x, grad_output, op_s).steps
        wrong = [s.case.label for s in steps if not s.bit_for_bit]
        if wrong:
            raise AssertionError(f"{wrong}: the step differs from the one-process model")
        return steps

    steps, verdicts = verified(measure, split_verdicts)
    return ZeroBubbleCheck(steps, verdicts)
