"""What a pipeline predicts and what a real run measured: the bubble, who holds what, step time, memory.

* The bubble in its two conventions: ``pipeline_bubble_fraction`` (idle share of the step,
  ``(p - 1) / (m + p - 1)``) and ``pipeline_bubble_ratio_to_ideal`` (Megatron-LM's ``(p - 1) / m``,
  Narayanan et al. 2021, section 2.2); ``split_layers`` (even, or ``counts`` set per slice: see
  ``stages``) and ``microbatch_sizes``.
* From a ``Schedule`` (``schedules.simulate`` times it): step time, idle slots, microbatches in flight,
  messages, and the schedule drawn as text.
* From a real run's spans (``runtime.timeline``): the idle fraction, the in-flight count, and each
  microbatch's trip through a forward-only run. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from shardlib.core.checks import near_equal_parts
from shardlib.core.pipeline.schedules import OPS, Schedule, check_count, simulate
from shardlib.runtime.timeline import Span


# -- the bubble: two conventions ----------------------------------------------------------------------
def pipeline_bubble_fraction(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """The share of each device's step time spent idle: ``(p - 1) / (m + p - 1)``.

    Convention: the idle *fraction* of the step (0 is no bubble, it never reaches 1). With ``p`` stages
    of equal cost and ``m`` microbatches, a step lasts ``m + p - 1`` microbatch-times per pass, of
    which each device is busy for ``m``. With interleaving (``n_chunks = v`` model chunks per device,
    each ``1/v`` as long) the fill and drain shrink ``v``-fold: ``(p - 1) / (v m + p - 1)``.
    One stage (``p = 1``) has no bubble; as ``m`` grows the fraction tends to 0.
    """
    p = check_count("n_stages", n_stages, "pipeline stages")
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    v = check_count("n_chunks", n_chunks, "model chunks per device")
    return (p - 1) / (v * m + p - 1)


def pipeline_bubble_ratio_to_ideal(n_stages: int, n_microbatches: int, n_chunks: int = 1) -> float:
    """Idle time over ideal compute time: ``(p - 1) / m`` (``(p - 1) / (v m)`` interleaved).

    Convention: the *ratio to ideal*, as Megatron-LM (Narayanan et al. 2021) and the Ultra-Scale
    Playbook write the bubble. It is not a share of the step: at ``p = 4, m = 1`` it is 3 (three
    microbatch-times idle for one busy). ``fraction = ratio / (1 + ratio)``.
    """
    p = check_count("n_stages", n_stages, "pipeline stages")
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    v = check_count("n_chunks", n_chunks, "model chunks per device")
    return (p - 1) / (v * m)


# -- who holds what --------------------------------------------------------------------------------
def microbatch_sizes(batch_size: int, n_microbatches: int) -> tuple[int, ...]:
    """Rows per microbatch when ``batch_size`` rows are cut into ``n_microbatches`` (as
    ``torch.tensor_split`` cuts them: the first ``batch % m`` get one row more)."""
    batch_size = check_count("batch_size", batch_size, "rows in the batch")
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    if m > batch_size:
        raise ValueError(
            f"cannot cut a batch of {batch_size} rows into {m} microbatches: each microbatch needs at "
            f"least one row, so use at most {batch_size} microbatches"
        )
    return near_equal_parts(batch_size, m)


# -- predictions from a schedule ----------------------------------------------------------------
def predicted_step_s(schedule: Schedule, forward_s=1, backward_s=1, hop_s=0) -> float:
    """The step time ``simulate`` predicts: from the first action's start to the last action's end."""
    return float(max(t.end_s for t in simulate(schedule, forward_s, backward_s, hop_s)))


def idle_slots(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, the slots it spends idle in one step when every action takes one slot (a chunk's
    forward or backward, alike). The step lasts ``max end`` slots for everyone; summed over stages and
    divided by ``p x step`` this is the bubble fraction."""
    v = schedule.n_chunks
    timed = simulate(schedule, forward_s=v, backward_s=v)  # each chunk op: exactly one slot
    step = max(t.end_s for t in timed)
    busy = [0] * schedule.n_stages
    for t in timed:
        busy[t.action.stage] += 1
    return tuple(int(step) - b for b in busy)


def step_slots(schedule: Schedule) -> int:
    """Slots in one step when every action takes one slot (see ``idle_slots``)."""
    v = schedule.n_chunks
    return int(max(t.end_s for t in simulate(schedule, forward_s=v, backward_s=v)))


def peak_in_flight(schedule: Schedule) -> tuple[int, ...]:
    """Per stage, the most microbatches (chunks) whose activations it holds at once: from the forward until
    the backward, or until the weight gradient W when the backward is split (B leaves what W needs). GPipe
    holds all ``m``; 1F1B holds at most ``p - s`` on stage ``s``. A forward-only schedule keeps nothing: 0."""
    release = "W" if schedule.split_backward else "B"
    peaks = []
    for row in schedule.actions:
        held = peak = 0
        if schedule.training:
            for a in row:
                held += 1 if a.op == "F" else -1 if a.op == release else 0
                peak = max(peak, held)
        peaks.append(peak)
    return tuple(peaks)


def messages_per_step(schedule: Schedule) -> int:
    """Point-to-point messages one step sends between stages: each microbatch crosses every boundary
    between virtual stages once forward (and once backward when training)."""
    return sum(len(schedule.messages(src, dst)) for src in range(schedule.n_stages)
               for dst in range(schedule.n_stages) if src != dst)


# -- measuring the bubble on a real timeline ----------------------------------------------------------
@dataclass(frozen=True)
class MeasuredBubble:
    """The idle fraction of a real run, from its compute spans.

    Definition: the window runs from the first compute span's start to the last compute span's end,
    across all ranks; ``busy_s[r]`` is the time rank ``r`` spent in compute spans; the idle fraction is
    ``1 - sum(busy_s) / (n_stages x window_s)``. Everything else a rank does in the window (waiting for
    a message, bookkeeping between ops) counts as idle.
    """

    window_s: float
    busy_s: tuple[float, ...]
    idle_fraction: float

    @property
    def n_stages(self) -> int:
        return len(self.busy_s)


def compute_spans(spans: Sequence[Span]) -> list[Span]:
    """The pipeline's compute spans (forwards and backwards) among all the spans of a run."""
    return [s for s in spans if s.kind == "compute" and s.attrs.get("op") in OPS]


def measure_bubble(spans: Sequence[Span], n_stages: int) -> MeasuredBubble:
    """The idle fraction of one step, measured from its spans (see ``MeasuredBubble``)."""
    p = check_count("n_stages", n_stages, "pipeline stages")
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
    """A forward-only run read per microbatch: ``trip_s[i]``, from the start of microbatch ``i``'s forward
    on the first stage to the end of its forward on the last (what one token waits: every stage in turn,
    and the hops between them), and ``gap_s``, the time between consecutive microbatches leaving the last
    stage (the pipeline's pace once full: the slowest stage's time)."""

    trip_s: tuple[float, ...]
    gap_s: tuple[float, ...]


def microbatch_trips(spans: Sequence[Span], n_stages: int) -> Trips:
    """Each microbatch's trip through a forward-only run, and the gaps between their departures, read
    from the real timeline (see ``Trips``)."""
    p = check_count("n_stages", n_stages, "pipeline stages")
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
    """Per rank, the most microbatches in flight, read from the real timeline: +1 at the end of each
    forward, -1 at the end of each backward (of each W when the backward is split), in time order. A run
    with no backwards at all was forward only and kept nothing for a backward: 0 (as ``peak_in_flight``)."""
    p = check_count("n_stages", n_stages, "pipeline stages")
    peaks = [0] * p
    if not any(s.attrs["op"] == "B" for s in compute_spans(spans)):
        return tuple(peaks)
    release = "W" if any(s.attrs["op"] == "W" for s in compute_spans(spans)) else "B"
    for rank in range(p):
        held = 0
        for s in sorted((s for s in compute_spans(spans) if s.rank == rank), key=lambda s: s.end_s):
            held += 1 if s.attrs["op"] == "F" else -1 if s.attrs["op"] == release else 0
            peaks[rank] = max(peaks[rank], held)
    return tuple(peaks)


def schedule_text(schedule: Schedule) -> str:
    """The schedule as a grid of labels, one line per stage, one column per slot ('.' for idle),
    every action one slot long."""
    timed = simulate(schedule, forward_s=schedule.n_chunks, backward_s=schedule.n_chunks)
    n_slots = int(max(t.end_s for t in timed))
    width = max(len(t.action.label) for t in timed)
    grid = [["."] * n_slots for _ in range(schedule.n_stages)]
    for t in timed:
        grid[t.action.stage][int(t.start_s)] = t.action.label
    return "\n".join(f"stage {s}: " + " ".join(cell.ljust(width) for cell in row).rstrip()
                     for s, row in enumerate(grid))


def order_text(schedule: Schedule) -> Mapping[int, str]:
    """Per stage, its actions in order as one line of labels (no timing)."""
    return {s: " ".join(a.label for a in row) for s, row in enumerate(schedule.actions)}


def stage_imbalance(work_per_stage: Sequence[float]) -> float:
    """The slowest stage's work over the mean stage's: how much longer a long pipeline's step lasts than
    with perfectly balanced stages (1.0: balanced). Once the pipeline is full, one microbatch leaves per
    slowest-stage time, whatever the others do."""
    work = [float(w) for w in work_per_stage]
    if not work or min(work) <= 0:
        raise ValueError(f"give each stage's work as a positive number, got {list(work_per_stage)}")
    return max(work) * len(work) / sum(work)


def pipeline_step_s(stage_s: Sequence[float], n_microbatches: int) -> float:
    """One pass of ``m`` microbatches through stages taking ``stage_s[s]`` seconds each (a forward-only
    GPipe step): ``sum(stage_s) + (m - 1) x max(stage_s)``. The first microbatch crosses every stage;
    the others leave one per slowest-stage time. Equal stages give ``(m + p - 1) x t``."""
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    times = [float(t) for t in stage_s]
    if not times or min(times) < 0:
        raise ValueError(f"give each stage's seconds per microbatch (0 or more), got {list(stage_s)}")
    return sum(times) + (m - 1) * max(times)
