"""What a pipeline predicts and what a real run measured: the bubble, who holds what, step time.

The bubble in two conventions: the idle share of the step, ``(p - 1) / (m + p - 1)``, and Megatron-LM's
ratio to ideal, ``(p - 1) / m`` (Narayanan et al. 2021, section 2.2). From a ``Schedule`` (timed by
``schedules.simulate``): step time, idle slots, microbatches in flight, messages. From a real run's spans:
the idle fraction, the in-flight count, each microbatch's trip. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardlib.core.checks import near_equal_parts, whole_number
from shardlib.core.pipeline.schedules import OPS, Schedule, simulate
from shardlib.runtime.timeline import Span


# -- the bubble: two conventions ----------------------------------------------------------------------
def pipeline_bubble_fraction(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """The share of each device's step spent idle: ``(p - 1) / (m + p - 1)``, or ``(p - 1) / (v m + p - 1)``
    with ``v`` model chunks per device (interleaved: fill and drain shrink ``v``-fold). 0 at ``p = 1``."""
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    m = whole_number(n_microbatches, "n_microbatches (microbatches per step)")
    v = whole_number(n_chunks, "n_chunks (model chunks per device)")
    return (p - 1) / (v * m + p - 1)


def pipeline_bubble_ratio_to_ideal(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Idle time over ideal compute: ``(p - 1) / (v m)``, Megatron-LM's and the Ultra-Scale Playbook's
    convention. Not a share of the step (3 at ``p = 4, m = 1``): ``fraction = ratio / (1 + ratio)``."""
    fraction = pipeline_bubble_fraction(n_stages, n_microbatches, n_chunks)
    return fraction / (1 - fraction)


# -- who holds what --------------------------------------------------------------------------------
def microbatch_sizes(batch_size: int, n_microbatches: int) -> tuple[int, ...]:
    """Rows per microbatch, cut as ``torch.tensor_split`` cuts: the first ``batch % m`` get one more."""
    batch_size = whole_number(batch_size, "batch_size (rows in the batch)")
    m = whole_number(n_microbatches, "n_microbatches (microbatches per step)")
    if m > batch_size:
        raise ValueError(
            f"cannot cut a batch of {batch_size} rows into {m} microbatches: each microbatch needs at "
            f"least one row, so use at most {batch_size} microbatches"
        )
    return near_equal_parts(batch_size, m)


# -- predictions from a schedule ----------------------------------------------------------------
def predicted_step_s(schedule: Schedule, forward_s=1, backward_s=1, hop_s=0, weight_s=None) -> float:
    """The step time ``simulate`` predicts (its durations): first action's start to last action's end."""
    return float(max(t.end_s for t in simulate(schedule, forward_s, backward_s, hop_s, weight_s)))


def step_slots(schedule: Schedule) -> int:
    """Slots in one step when every action takes one slot."""
    return int(predicted_step_s(schedule, schedule.n_chunks, schedule.n_chunks))  # each chunk op: one slot


def idle_slots(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, the slots it idles in one step when every action takes one slot."""
    return tuple(step_slots(schedule) - len(row) for row in schedule.actions)


def _peak_held(ops: Sequence[str], release: str) -> int:
    """The most microbatches held at once along ``ops``: one more at each F, one fewer at each ``release``."""
    held = peak = 0
    for op in ops:
        held += 1 if op == "F" else -1 if op == release else 0
        peak = max(peak, held)
    return peak


def peak_in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, the most microbatches (chunks) whose activations it holds at once: from F until B
    (until W when the backward is split). GPipe holds ``m``; 1F1B ``p - s`` on stage ``s``; forward only 0."""
    release = "W" if schedule.split_backward else "B"
    return tuple(_peak_held([a.op for a in row], release) if schedule.training else 0 for row in schedule.actions)


def messages_per_step(schedule: Schedule) -> int:
    """Point-to-point messages one step sends between stages."""
    return sum(len(schedule.messages(src, dst)) for src in range(schedule.n_stages)
               for dst in range(schedule.n_stages) if src != dst)


# -- measuring the bubble on a real timeline ----------------------------------------------------------
@dataclass(frozen=True)
class MeasuredBubble:
    """The idle fraction of a real run: ``1 - sum(busy_s) / (n_stages x window_s)``, the window from the
    first compute span's start to the last one's end; waiting and bookkeeping count as idle."""

    window_s: float
    busy_s: tuple[float, ...]
    idle_fraction: float


def compute_spans(spans: Sequence[Span]) -> list[Span]:
    """The pipeline's compute spans among all the spans of a run."""
    return [s for s in spans if s.kind == "compute" and s.attrs.get("op") in OPS]


def measure_bubble(spans: Sequence[Span], n_stages: int) -> MeasuredBubble:
    """The idle fraction of one step, measured from its spans (``MeasuredBubble``)."""
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    work = compute_spans(spans)
    if not work:
        raise ValueError("no pipeline compute spans to measure: run a pipeline step on the ranks first")
    bad = sorted({s.rank for s in work if not 0 <= s.rank < p})
    if bad:
        raise ValueError(f"spans from ranks {bad} do not belong to a {p}-stage pipeline")
    start, end = min(s.start_s for s in work), max(s.end_s for s in work)
    window = end - start
    busy = [0.0] * p
    for s in work:
        busy[s.rank] += s.duration_s
    idle = 1.0 - sum(busy) / (p * window) if window > 0 else 0.0
    return MeasuredBubble(window, tuple(busy), idle)


@dataclass(frozen=True)
class Trips:
    """A forward-only run per microbatch: ``trip_s[i]`` from its first forward's start to its last forward's
    end, and ``gap_s`` between consecutive departures from the last stage (the slowest stage's pace)."""

    trip_s: tuple[float, ...]
    gap_s: tuple[float, ...]


def microbatch_trips(spans: Sequence[Span], n_stages: int) -> Trips:
    """Each microbatch's trip through a forward-only run, read from the timeline (``Trips``)."""
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    forwards = [s for s in compute_spans(spans) if s.attrs["op"] == "F"]
    entered = {s.attrs["microbatch"]: s.start_s for s in forwards if s.rank == 0}
    left = {s.attrs["microbatch"]: s.end_s for s in forwards if s.rank == p - 1}
    if not entered or set(entered) != set(left):
        raise ValueError(f"need every microbatch's forward on stage 0 and on stage {p - 1}: run a forward-only "
                         f"{p}-stage pipeline first")
    order = sorted(left, key=left.get)
    departures = [left[i] for i in order]
    return Trips(tuple(left[i] - entered[i] for i in sorted(left)),
                 tuple(b - a for a, b in zip(departures, departures[1:])))


def measured_in_flight(spans: Sequence[Span], n_stages: int) -> tuple[int, ...]:
    """Per rank, the most microbatches in flight on the real timeline: +1 at each F's end, -1 at each B's
    (W's when split). A forward-only run keeps nothing: 0."""
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    work = sorted(compute_spans(spans), key=lambda s: s.end_s)
    ops = {s.attrs["op"] for s in work}
    if "B" not in ops:
        return (0,) * p
    release = "W" if "W" in ops else "B"
    return tuple(_peak_held([s.attrs["op"] for s in work if s.rank == r], release) for r in range(p))


def stage_imbalance(work_per_stage: Sequence[float]) -> float:
    """The slowest stage's work over the mean stage's (1.0: balanced): once full, a pipeline moves at
    the slowest stage's pace."""
    work = [float(w) for w in work_per_stage]
    if not work or min(work) <= 0:
        raise ValueError(f"give each stage's work as a positive number, got {list(work_per_stage)}")
    return max(work) * len(work) / sum(work)

