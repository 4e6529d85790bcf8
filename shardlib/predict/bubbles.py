"""The published bubbles (the registry's), in both notations, over one step's window; F, B and W from a run.

The notation trap: Qi et al. 2024 (zero bubble) write B for the input gradient only, so 1F1B idles
``(p-1)(F+B+W)`` per stage and ZB-H1 ``(p-1)(F+B-W)``. DualPipe's README writes B for the whole backward
(input and weight gradients): 1F1B ``(PP-1)(F+B)``, ZB1P ``(PP-1)(F+B-2W)``, DualPipe(V)
``(PP/2-1)(F&B+B-3W)``, compared "based on the same number of PP stages": DualPipeV runs ``PP`` stages on
``PP/2`` devices, two chunks each, and F, B, W are one chunk's. ZB-V has no formula in either, only
"zero bubble" at F = B = W (see ``published_idle_s``). Here F, B, W are always one action's (one chunk's)
times and B is the input gradient; ``full_backward_s`` is DualPipe's B. Pure: no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.pipeline.registry import (
    SPECS,
    schedule_spec,
)
from shardlib.core.pipeline.schedules import Action, Schedule, simulate
from shardlib.runtime.timeline import Span

PUBLISHED = tuple(name for name, spec in SPECS.items() if spec.bubble is not None)  # ZB-V's: F = B = W only


@dataclass(frozen=True)
class OpCosts:
    """One action's time: forward, B (input gradient only, Qi's B) and W (weight gradient)."""

    forward_s: float
    backward_s: float
    weight_s: float

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_s", "weight_s"):
            number_at_least(getattr(self, name), f"{name} (seconds per action)")

    @property
    def full_backward_s(self) -> float:
        """The whole backward, input and weight gradients: DualPipe's README's B."""
        return self.backward_s + self.weight_s


def published_idle_s(name: str, n_stages: int, costs: OpCosts) -> float:
    """Per device, the idle time of one step by the published formula (the registry's ``Bubble``, where it
    holds: its ``holds`` and ``condition``), in Qi's notation (B the input gradient), over one step's
    window. ZB-V has no published formula, only "zero bubble" at F = B = W; within one step's window the
    ramp stays, ``(p-1) F`` per device, and F, B and W must be equal within ``EQUAL_WITHIN``."""
    spec = schedule_spec(name)
    p = whole_number(n_stages, "n_stages (pipeline stages, devices)")
    if spec.bubble is None:
        raise ValueError(f"no published closed-form bubble for {name!r} ({spec.no_bubble}); the formulas cover "
                         f"{', '.join(PUBLISHED)} (simulate gives any schedule's)")
    return spec.bubble.idle_s(p, costs.forward_s, costs.backward_s, costs.weight_s)


def published_fraction(schedule: Schedule, costs: OpCosts) -> float:
    """The published bubble as a share of the step: ``idle / (idle + busy)``, busy ``m v (F + B + W)``."""
    idle = published_idle_s(schedule.name, schedule.n_stages, costs)
    return idle / (idle + schedule.n_microbatches * schedule.n_chunks * (costs.forward_s + costs.full_backward_s))


def simulated_fraction(schedule: Schedule, costs: OpCosts, hop_s: float = 0.0) -> float:
    """The idle share of this very list of actions, timed by ``simulate`` with these costs (and ``hop_s``
    added to every message between stages)."""
    v = schedule.n_chunks
    timed = simulate(schedule, costs.forward_s * v, costs.backward_s * v, hop_s, costs.weight_s * v)
    step = max(t.end_s for t in timed)
    return float(1 - sum(t.end_s - t.start_s for t in timed) / (schedule.n_stages * step))


def notation_rows(costs: OpCosts, n_stages: int, names: tuple[str, ...] = ("1f1b", "zb-h1")
                  ) -> list[tuple[str, str, float, str, float]]:
    """The notation trap, side by side, for the schedules ``names``: (schedule, Qi's formula, its value,
    DualPipe's, its value), each evaluated from the registry's formula in its own notation."""
    p, f, b, w, full = n_stages, costs.forward_s, costs.backward_s, costs.weight_s, costs.full_backward_s
    rows = []
    for name in names:
        spec = schedule_spec(name)
        bubble = spec.bubble
        if bubble is None or bubble.qi_idle is None or bubble.dualpipe_idle is None:
            raise ValueError(f"{spec.title} has no published formula to write two ways")
        label = spec.title + (f" / {spec.also_called}" if spec.also_called else "")
        rows.append((label, bubble.qi, bubble.qi_idle(p, f, b, w), bubble.dualpipe,
                     bubble.dualpipe_idle(p, f, full, w)))
    return rows


def op_costs(spans: Sequence[Span]) -> OpCosts:
    """The median F, B and W of a run with the backward split, from its compute spans."""
    times = {op: [s.duration_s for s in spans if s.kind == "compute" and s.attrs.get("op") == op] for op in "FBW"}
    if not all(times.values()):
        raise ValueError("need F, B and W spans: run a schedule with the backward split "
                         f"({', '.join(n for n, spec in SPECS.items() if spec.split_backward)})")
    return OpCosts(*(statistics.median(times[op]) for op in "FBW"))


def handover_s(spans: Sequence[Span], schedule: Schedule) -> float:
    """The median hand-over of a run: from the end of an action on one stage to the end of the wait of the
    action on the next stage that needed its result, over the waits that began before that result was
    ready (the consumer was waiting on it). 0.0 when no action waited."""
    ends = {(s.rank, s.attrs["microbatch"], s.attrs["op"], s.attrs["chunk"]): s.end_s for s in spans
            if s.kind == "compute" and s.attrs.get("op") in ("F", "B", "W")}
    gaps = []
    for s in spans:
        if s.kind != "wait" or "source" not in s.attrs:
            continue
        dep = schedule.producer(Action(s.rank, s.attrs["microbatch"], s.attrs["op"], s.attrs["chunk"]))
        end = ends.get((dep.stage, dep.microbatch, dep.op, dep.chunk))
        if end is not None and s.start_s < end <= s.end_s:
            gaps.append(s.end_s - end)
    return statistics.median(gaps) if gaps else 0.0
