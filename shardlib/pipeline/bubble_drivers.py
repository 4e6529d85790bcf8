"""Schedules past 1F1B run on a pool, with F, B and W padded to set costs and the bubble measured.

* ``run_pipeline`` (``drivers``) takes ``weight_s``: F, B and W each padded to its own duration
  (``weight_s`` is the knob that makes W cheap or dear), gathered into a ``PipelineRun``.
* ``run_split_bubble``: the idle share of one schedule measured (median of ``repeats`` steps) against the
  published formula and against ``simulate`` of the same list, both evaluated with the F, B and W
  measured on the ranks, and ``simulate`` again with the hand-over between stages measured on the ranks
  added to every message (``bubbles.handover_s``), gathered into a ``SplitBubble``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from ..models import ModelConfig
from .bubbles import PUBLISHED, OpCosts, handover_s, op_costs, published_fraction, simulated_fraction
from .drivers import PipelineRun, run_pipeline
from .orders import make_schedule
from .schedules import check_count


@dataclass(frozen=True)
class SplitBubble:
    """One schedule's idle share on the ranks (``attempts``, their median ``measured``), the costs
    measured on a zero-bubble run of the same pads (``costs``, per action), the published formula (``None``
    where none applies: ZB-V's needs F = B = W) and ``simulate`` evaluated with them, ``simulate`` with the
    measured ``handover_s`` on every message (``with_hops``), and the peak chunks in flight per stage."""

    name: str
    n_stages: int
    n_microbatches: int
    costs: OpCosts
    attempts: tuple[float, ...]
    published: float | None
    simulated: float
    peak_in_flight: tuple[int, ...]
    handover_s: float = 0.0
    with_hops: float | None = None

    @property
    def measured(self) -> float:
        return statistics.median(self.attempts)


def run_split_bubble(ranks, name: str, n_microbatches: int, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor, op_s: float, weight_s: float, repeats: int = 3,
                     costs: OpCosts | None = None) -> SplitBubble:
    """Measure schedule ``name``'s idle share with each stage's F and B padded to ``op_s`` and W to
    ``weight_s``. The costs the formulas use are read from the spans (of this run, or for 1F1B, whose
    backward is whole, of a ZB-H1 run with the same pads), unless given: ``costs`` of an earlier
    ``SplitBubble`` with the same pads saves that run."""
    repeats = check_count("repeats", repeats, "steps to take the median of")
    schedule = make_schedule(name, ranks.world_size, n_microbatches)

    def step() -> PipelineRun:
        return run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s, weight_s=weight_s)

    runs = [step() for _ in range(repeats)]
    if costs is None and schedule.split_backward:
        costs = op_costs(runs[0].spans)
    elif costs is None:
        twin = make_schedule("zb-h1", ranks.world_size, n_microbatches)
        costs = op_costs(run_pipeline(ranks, twin, model, layers, x, grad_output, op_s, op_s, weight_s=weight_s).spans)
    try:
        published = published_fraction(schedule, costs) if name in PUBLISHED else None
    except ValueError:  # the formula's condition does not hold (ZB-V's F = B = W)
        published = None
    hop_s = statistics.median(handover_s(r.spans, schedule) for r in runs)
    return SplitBubble(name, schedule.n_stages, n_microbatches, costs, tuple(r.bubble.idle_fraction for r in runs),
                       published, simulated_fraction(schedule, costs), runs[0].peak_in_flight, hop_s,
                       simulated_fraction(schedule, costs, hop_s))
