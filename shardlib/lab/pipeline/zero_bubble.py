"""The zero-bubble claims of notebook 09: each schedule's step measured on the ranks beside the prediction
of its own list of actions (``simulate``), evaluated with the F, B and W measured in the same run.

* ``SplitCase``: one schedule to measure (its name, ``m``, and W's cost as a multiple of F's).
* ``run_split_step``: one case on a pool, read as a ``SplitStep`` (predicted: the list, the list with the
  measured hand-over, the published formula; measured: step and idle share).
* ``run_zero_bubble_check``: the cases in order, one ``Verdict`` each on the step time (``split_verdicts``),
  measured again while a busy machine spoils a verdict (``verified``); a 1F1B case (whole backward)
  borrows the F, B and W of the split case before it with the same W.

The band (``LOW``-``HIGH``, 0.9-1.5) is on the step, not the idle share (a few per cent doubles from a few
milliseconds of overhead). The hand-overs and the Python between ops add about 5-20 % to ops of 20 ms.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.registry import make_schedule, schedule_spec
from shardlib.lab.pipeline.step import PipelineRun, run_pipeline
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict import bubbles
from shardlib.predict.bubbles import OpCosts, simulated_fraction
from shardlib.predict.pipeline import predicted_step_s

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
        return f"{schedule_spec(self.name).title} step, m = {self.n_microbatches}{w}"


@dataclass(frozen=True)
class SplitStep:
    """One case on the ranks (``run``, every repeat) and the F, B and W it is predicted with (``costs``, one
    action's). Predicted: the list played out with them; measured: medians over the repeats."""

    case: SplitCase
    run: PipelineRun = field(repr=False)
    costs: OpCosts

    schedule = property(lambda self: self.run.schedule)
    predicted_step_s = property(lambda self: predicted_step_s(self.schedule, *(self.schedule.n_chunks * t for t in (
        self.costs.forward_s, self.costs.backward_s, 0, self.costs.weight_s))))  # the list played out
    predicted_idle = property(lambda self: simulated_fraction(self.schedule, self.costs))
    with_hops = property(lambda self: simulated_fraction(self.schedule, self.costs, self.handover_s))
    attempts = property(lambda self: tuple(b.idle_fraction for b in self.run.bubbles))  # per repeat
    measured_idle = property(lambda self: statistics.median(self.attempts))
    measured_step_s = property(lambda self: statistics.median(b.window_s for b in self.run.bubbles))

    @property
    def handover_s(self) -> float:
        """The hand-over between stages measured on the ranks (median over the repeats)."""
        repeats = map(self.run.at, range(self.run.repeats))
        return statistics.median(bubbles.handover_s(r.spans, self.schedule) for r in repeats)

    @property
    def published(self) -> float | None:
        """The published formula with ``costs``; ``None`` where none applies (ZB-V's needs F = B = W)."""
        try:
            return bubbles.published_fraction(self.schedule, self.costs)
        except ValueError:
            return None


def run_split_step(ranks, case, model: ModelConfig, layers: list[dict], x: torch.Tensor, grad_output: torch.Tensor,
                   op_s: float = 0.02, repeats: int = 1, costs: OpCosts | None = None) -> SplitStep:
    """``case`` (a ``SplitCase`` or ``(name, m, weight_ratio)``) run ``repeats`` times on ``ranks``, F and B
    padded to ``op_s``, W to ``weight_ratio * op_s``. The costs are read from the first repeat's spans (for
    1F1B, whose backward is whole, from a ZB-H1 run with the same pads), unless given."""
    case = case if isinstance(case, SplitCase) else SplitCase(*case)
    p, m, weight_s = ranks.world_size, case.n_microbatches, case.weight_ratio * op_s
    run = run_pipeline(ranks, make_schedule(case.name, p, m), model, layers, x, grad_output, op_s, op_s,
                       weight_s=weight_s, repeats=repeats)
    if costs is None:
        twin = run if case.split else run_pipeline(ranks, make_schedule("zb-h1", p, m), model, layers, x,
                                                   grad_output, op_s, op_s, weight_s=weight_s)
        costs = bubbles.op_costs(twin.at(0).spans)
    return SplitStep(case, run, costs)


def _cases(cases) -> tuple[SplitCase, ...]:
    cases = tuple(c if isinstance(c, SplitCase) else SplitCase(*c) for c in cases)
    if not cases:
        raise ValueError("give at least one case to measure, e.g. ('zb-h1', 4, 1.0)")
    for i, case in enumerate(cases):
        if not case.split and not any(c.split and c.weight_ratio == case.weight_ratio for c in cases[:i]):
            raise ValueError(f"{case.label}: a schedule with a whole backward has no W of its own to measure; put a "
                             f"split schedule with W = {case.weight_ratio:g} F before it (e.g. 'zb-h1')")
    return cases


def split_verdicts(steps) -> tuple[Verdict, ...]:
    """One verdict per step: the list's step predicted, the step measured beside it, within ``LOW``-``HIGH``."""
    return tuple(Verdict(s.case.label, s.predicted_step_s, s.measured_step_s, "s", LOW, HIGH) for s in steps)


@dataclass(frozen=True)
class ZeroBubbleCheck:
    """The cases' ``steps`` and their ``verdicts``."""

    steps: tuple[SplitStep, ...]
    verdicts: tuple[Verdict, ...]


def run_zero_bubble_check(ranks, cases, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor, op_s: float = 0.02) -> ZeroBubbleCheck:
    """Each of ``cases`` (``SplitCase`` or ``(name, m, weight_ratio)`` tuples) run once on ``ranks``
    (``run_split_step``), in order, a whole-backward case borrowing the costs of the split case before it
    with the same W; measured again until every verdict holds, at most three rounds (``verified``). A step
    that differs from the one-process model raises at once: that is a bug, not a busy machine."""
    cases = _cases(cases)

    def measure() -> tuple[SplitStep, ...]:
        steps: list[SplitStep] = []
        for case in cases:
            borrowed = None if case.split else next(s.costs for s in steps
                                                    if s.case.split and s.case.weight_ratio == case.weight_ratio)
            steps.append(run_split_step(ranks, case, model, layers, x, grad_output, op_s, costs=borrowed))
        wrong = [s.case.label for s in steps if not s.run.against_reference().bit_for_bit]
        if wrong:
            raise AssertionError(f"{wrong}: the step differs from the one-process model")
        return tuple(steps)

    return ZeroBubbleCheck(*verified(measure, split_verdicts))
