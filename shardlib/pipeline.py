"""Pipeline parallelism on paper: the bubble formulas, and schedules as data.

Pipeline parallelism gives each device (a *stage*) a contiguous slice of the layers. A batch is cut
into ``m`` *microbatches* that flow stage to stage, so stage 2 can work on microbatch 0 while stage 1
works on microbatch 1. At the start of a step the later stages have nothing to do yet (the pipeline
*fills*), and at the end the earlier ones have finished (it *drains*): that idle time is the *bubble*.

Two conventions measure it, and every function here says which one it returns:

* ``pipeline_bubble_fraction(p, m) = (p - 1) / (m + p - 1)``: the share of each device's step time spent
  idle. This is the idle fraction a profiler shows, and what the notebooks measure on real ranks.
* ``pipeline_bubble_ratio_to_ideal(p, m) = (p - 1) / m``: idle time divided by the ideal (bubble-free)
  compute time. Megatron-LM (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on
  GPU Clusters", section 2.2) and the Ultra-Scale Playbook quote this one. It can exceed 1.

A schedule is data: for each stage, the ordered list of ``Action`` s it runs (forward ``"F"`` or
backward ``"B"`` of one microbatch, on one model chunk). The same ``Schedule`` drives the real run on
ranks (``pipeline_ranks.py``) and the figures (``pipeline_plots.py``), and ``simulate`` turns it into
predicted times. Three schedules are built here:

* **GPipe** (Huang et al. 2019): every forward, then every backward. A stage keeps the activations of
  all ``m`` microbatches until their backwards.
* **1F1B** (PipeDream-Flush: Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training";
  the schedule Megatron-LM uses): a few forwards to fill the pipeline, then one forward, one backward
  in turn. Same bubble as GPipe, but stage ``s`` keeps at most ``p - s`` microbatches in flight.
* **Interleaved 1F1B** (Narayanan et al. 2021, Megatron-LM, section 2.2.2): each device holds ``v``
  non-adjacent chunks of layers (device ``r`` holds virtual stages ``r, r + p, r + 2p ...``), so a
  microbatch visits every device ``v`` times, each visit ``1/v`` as long. The bubble shrinks ``v``-fold
  at the price of more messages: ``(p v - 1) / (p - 1)`` times as many, close to ``v`` for many stages.

For inference (forward only) GPipe and 1F1B are the same list of forwards: the difference between them
is only where the backwards go.

Pure: no ``torch``, no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral, Real
from typing import Mapping, Sequence

from .checks import whole_number
from .timeline import Span

OPS = ("F", "B")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
SCHEDULE_TITLES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B"}


# -- checks shared by everything below ----------------------------------------------------------------
def check_count(name: str, value, what: str) -> int:
    """``value`` as an int, or a ValueError saying it must be a whole number of at least 1."""
    return whole_number(value, f"{name} ({what})")


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
def split_layers(n_layers: int, n_parts: int) -> tuple[range, ...]:
    """Cut ``n_layers`` layers into ``n_parts`` contiguous slices, sizes differing by at most one
    (the earlier slices get the extra layers). Each slice needs at least one whole layer."""
    n_layers = check_count("n_layers", n_layers, "layers in the model")
    n_parts = check_count("n_parts", n_parts, "slices of the layer stack")
    if n_parts > n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {n_parts} slices: each slice needs at least "
                         "one whole layer")
    base, extra = divmod(n_layers, n_parts)
    bounds, start = [], 0
    for i in range(n_parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append(range(start, stop))
        start = stop
    return tuple(bounds)


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
    base, extra = divmod(batch_size, m)
    return tuple(base + (1 if i < extra else 0) for i in range(m))


# -- schedules as data -----------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Action:
    """One unit of pipeline work: stage ``stage`` runs the forward (``"F"``) or backward (``"B"``) of
    microbatch ``microbatch`` through its model chunk ``chunk`` (always 0 without interleaving)."""

    stage: int
    microbatch: int
    op: str
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"an action's op is 'F' (forward) or 'B' (backward), got {self.op!r}")

    @property
    def label(self) -> str:
        """``F3`` (forward of microbatch 3), ``B0.1`` (backward of microbatch 0 on chunk 1)."""
        return f"{self.op}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """Per stage, the ordered actions it runs in one step. Build one with ``make_schedule``.

    ``actions[s]`` is stage ``s``'s list. Stage ``s`` on chunk ``c`` is *virtual stage* ``c * p + s``;
    a microbatch's forward visits virtual stages ``0, 1, ... p v - 1`` in order, its backward the
    reverse. Building one checks the lists (``check_schedule``): every (stage, microbatch, op, chunk)
    exactly once, and an order that can run without waiting on anything that comes later.
    """

    name: str
    n_stages: int
    n_microbatches: int
    training: bool
    n_chunks: int
    actions: tuple[tuple[Action, ...], ...] = field(repr=False)

    def __post_init__(self) -> None:
        check_count("n_stages", self.n_stages, "pipeline stages")
        check_count("n_microbatches", self.n_microbatches, "microbatches per step")
        check_count("n_chunks", self.n_chunks, "model chunks per device")
        check_schedule(self)

    @property
    def title(self) -> str:
        kind = "training" if self.training else "inference (forward only)"
        chunks = f", v = {self.n_chunks}" if self.n_chunks > 1 else ""
        return f"{SCHEDULE_TITLES.get(self.name, self.name)}, {kind}: p = {self.n_stages}, m = {self.n_microbatches}{chunks}"

    @property
    def n_virtual_stages(self) -> int:
        return self.n_stages * self.n_chunks

    def virtual_stage(self, action: Action) -> int:
        return action.chunk * self.n_stages + action.stage

    def at_virtual_stage(self, virtual_stage: int, microbatch: int, op: str) -> Action:
        chunk, stage = divmod(virtual_stage, self.n_stages)
        return Action(stage, microbatch, op, chunk)

    def producer(self, action: Action) -> Action | None:
        """The action whose result ``action`` consumes: the previous virtual stage's forward for a
        forward, the next virtual stage's backward for a backward (for the last virtual stage: its
        own forward of that microbatch). ``None`` for the first forward (it reads the batch)."""
        vs = self.virtual_stage(action)
        if action.op == "F":
            return None if vs == 0 else self.at_virtual_stage(vs - 1, action.microbatch, "F")
        if vs == self.n_virtual_stages - 1:
            return self.at_virtual_stage(vs, action.microbatch, "F")
        return self.at_virtual_stage(vs + 1, action.microbatch, "B")

    def destination(self, action: Action) -> int | None:
        """The stage that ``action``'s result is sent to, or ``None`` when nothing is sent (the last
        forward's output and the first backward's input gradient are the step's results)."""
        vs = self.virtual_stage(action)
        nxt = vs + 1 if action.op == "F" else vs - 1
        if not 0 <= nxt < self.n_virtual_stages:
            return None
        return nxt % self.n_stages

    def messages(self, src: int, dst: int) -> tuple[Action, ...]:
        """The actions of stage ``src`` whose results travel to stage ``dst``, in the order ``src``
        sends them. A receiver reads its messages in this order (point-to-point messages between two
        ranks arrive in the order they were sent)."""
        return tuple(a for a in self.actions[src] if self.destination(a) == dst and dst != src)

    def all_actions(self) -> list[Action]:
        return [a for row in self.actions for a in row]


def _gpipe_order(p: int, m: int, training: bool) -> list[list[Action]]:
    rows = []
    for s in range(p):
        row = [Action(s, i, "F") for i in range(m)]
        if training:
            row += [Action(s, i, "B") for i in range(m)]
        rows.append(row)
    return rows


def _one_f_one_b_order(p: int, m: int, training: bool) -> list[list[Action]]:
    if not training:
        return _gpipe_order(p, m, training)
    rows = []
    for s in range(p):
        warmup = min(p - s - 1, m)  # forwards that fill the pipeline before the first backward can come back
        row = [Action(s, i, "F") for i in range(warmup)]
        for k in range(m - warmup):  # steady state: one forward, one backward
            row += [Action(s, warmup + k, "F"), Action(s, k, "B")]
        row += [Action(s, i, "B") for i in range(m - warmup, m)]  # drain
        rows.append(row)
    return rows


def _interleaved_order(p: int, m: int, v: int, training: bool) -> list[list[Action]]:
    """Megatron-LM's interleaved order. Work unit ``k`` of a stage (``k = 0 .. m v - 1``) is, going
    forward, chunk ``(k // p) % v`` of microbatch ``(k // (p v)) p + k % p``: groups of ``p``
    microbatches go through chunk 0, then the same group through chunk 1, and so on. Backwards walk the
    chunks in reverse. Stage ``s`` runs ``(v - 1) p + 2 (p - 1 - s)`` forwards before its first backward."""

    def unit(k: int, forward: bool) -> tuple[int, int]:
        chunk = (k % (p * v)) // p
        return (k // (p * v)) * p + k % p, chunk if forward else v - 1 - chunk

    total = m * v
    rows = []
    for s in range(p):
        warmup = total if not training else min((v - 1) * p + 2 * (p - 1 - s), total)
        row = []
        for k in range(warmup):
            mb, chunk = unit(k, True)
            row.append(Action(s, mb, "F", chunk))
        if training:
            for k in range(total - warmup):
                mb, chunk = unit(warmup + k, True)
                row.append(Action(s, mb, "F", chunk))
                mb, chunk = unit(k, False)
                row.append(Action(s, mb, "B", chunk))
            for k in range(total - warmup, total):
                mb, chunk = unit(k, False)
                row.append(Action(s, mb, "B", chunk))
        rows.append(row)
    return rows


def make_schedule(name: str, n_stages: int, n_microbatches: int, training: bool = True,
                  n_chunks: int = 1) -> Schedule:
    """Build and check the schedule ``name`` (one of ``SCHEDULES``): ``"gpipe"``, ``"1f1b"`` or
    ``"interleaved-1f1b"`` (which needs ``n_chunks >= 2`` and ``n_microbatches`` a multiple of
    ``n_stages``, as in Megatron-LM)."""
    if name not in SCHEDULES:
        raise ValueError(f"no pipeline schedule called {name!r}; the schedules are {', '.join(map(repr, SCHEDULES))}")
    p = check_count("n_stages", n_stages, "pipeline stages")
    m = check_count("n_microbatches", n_microbatches, "microbatches per step")
    v = check_count("n_chunks", n_chunks, "model chunks per device")
    if not isinstance(training, bool):
        raise ValueError(f"training must be True (forward and backward) or False (forward only), got {training!r}")
    if name == "interleaved-1f1b":
        if v < 2:
            raise ValueError(f"interleaved 1F1B needs at least 2 model chunks per device, got n_chunks = {v}; "
                             "with one chunk it is plain 1F1B")
        if m % p:
            raise ValueError(
                f"interleaved 1F1B sends microbatches through in groups of n_stages = {p}, so n_microbatches "
                f"must be a multiple of {p}; got {m}"
            )
        rows = _interleaved_order(p, m, v, training)
    elif v != 1:
        raise ValueError(f"{SCHEDULE_TITLES[name]} gives each device one model chunk; n_chunks = {v} needs "
                         "'interleaved-1f1b'")
    else:
        rows = (_gpipe_order if name == "gpipe" else _one_f_one_b_order)(p, m, training)
    return Schedule(name, p, m, training, v, tuple(tuple(r) for r in rows))  # checked as it is built


def check_schedule(schedule: Schedule) -> None:
    """Raise ValueError unless every stage's list holds exactly its own actions, each (stage,
    microbatch, op, chunk) once (no backwards when forward-only), in an order that can run: no stage
    waits on a result that can only come after it (``simulate`` finds such a wait)."""
    p, m, v = schedule.n_stages, schedule.n_microbatches, schedule.n_chunks
    if len(schedule.actions) != p:
        raise ValueError(f"a schedule for {p} stages needs {p} action lists, got {len(schedule.actions)}")
    ops = OPS if schedule.training else ("F",)
    expected = {Action(s, i, op, c) for s in range(p) for i in range(m) for op in ops for c in range(v)}
    seen: set[Action] = set()
    for s, row in enumerate(schedule.actions):
        for a in row:
            if a.stage != s:
                raise ValueError(f"stage {s}'s list holds {a.label} of stage {a.stage}")
            if a not in expected:
                raise ValueError(f"stage {s} runs {a.label}, which is not part of this step "
                                 f"(m = {m}, v = {v}, {'training' if schedule.training else 'forward only'})")
            if a in seen:
                raise ValueError(f"stage {s} runs {a.label} twice")
            seen.add(a)
    missing = sorted(expected - seen)
    if missing:
        shown = ", ".join(f"stage {a.stage} {a.label}" for a in missing[:5])
        raise ValueError(f"{len(missing)} actions never run: {shown}{' ...' if len(missing) > 5 else ''}")
    simulate(schedule)  # raises if the order deadlocks


# -- predictions from a schedule -------------------------------------------------------------------
@dataclass(frozen=True)
class TimedAction:
    """An action with its start and end times (in whatever unit the durations were given)."""

    action: Action
    start_s: float
    end_s: float


def _per_stage(value, n_stages: int, name: str) -> list:
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value] * n_stages
    if len(values) != n_stages:
        raise ValueError(f"{name} needs one duration per stage ({n_stages}), got {len(values)}")
    for x in values:
        if isinstance(x, bool) or not isinstance(x, Real) or not x >= 0:
            raise ValueError(f"{name} must be durations of at least 0 seconds, got {x!r}")
    # whole numbers stay exact (slot counting); anything else is float seconds
    return [Fraction(x) if isinstance(x, (Integral, Fraction)) else float(x) for x in values]


def simulate(schedule: Schedule, forward_s=1, backward_s=1, hop_s=0) -> list[TimedAction]:
    """When each action runs if every stage works through its list in order, starting each action as
    soon as the stage is free and the action's input has arrived.

    ``forward_s`` and ``backward_s`` are one stage's time for the forward and backward of one
    microbatch through all its layers: a number, or one per stage (a slow stage). With ``v`` chunks a
    chunk's op takes ``1/v`` of it. ``hop_s`` is added to every message between stages. Whole-number
    durations give exact results (fractions). Raises ValueError when the order deadlocks.
    """
    p, v = schedule.n_stages, schedule.n_chunks
    fwd, bwd = _per_stage(forward_s, p, "forward_s"), _per_stage(backward_s, p, "backward_s")
    hop = _per_stage(hop_s, 1, "hop_s")[0]
    done: dict[Action, object] = {}
    free = [Fraction(0)] * p
    pos = [0] * p
    timed: list[TimedAction] = []
    total = sum(len(row) for row in schedule.actions)
    while len(timed) < total:
        progressed = False
        for s in range(p):
            row = schedule.actions[s]
            while pos[s] < len(row):
                a = row[pos[s]]
                dep = schedule.producer(a)
                if dep is not None and dep not in done:
                    break
                ready = 0 if dep is None else done[dep] + (hop if dep.stage != s else 0)
                start = max(free[s], ready)
                end = start + (fwd[s] if a.op == "F" else bwd[s]) / v
                done[a], free[s] = end, end
                timed.append(TimedAction(a, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:
            stuck = []
            for s in range(p):
                if pos[s] < len(schedule.actions[s]):
                    a = schedule.actions[s][pos[s]]
                    stuck.append(f"stage {s} waits at {a.label} for {schedule.producer(a).label} "
                                 f"of stage {schedule.producer(a).stage}")
            raise ValueError("this order deadlocks: " + "; ".join(stuck))
    return timed


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
    """Per stage, the most microbatches whose activations it holds at once.

    A microbatch (on one chunk) is in flight on a stage from its forward until its backward: the
    forward's activations are kept for the backward. GPipe holds all ``m``; 1F1B holds at most
    ``p - s`` on stage ``s``. A forward-only schedule keeps nothing for a backward: 0.
    """
    peaks = []
    for row in schedule.actions:
        held = peak = 0
        if schedule.training:
            for a in row:
                held += 1 if a.op == "F" else -1
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


def measured_in_flight(spans: Sequence[Span], n_stages: int) -> tuple[int, ...]:
    """Per rank, the most microbatches in flight, read from the real timeline: +1 at the end of each
    forward, -1 at the end of each backward, in time order. A run with no backwards at all was
    forward only and kept nothing for a backward: 0 (as ``peak_in_flight`` counts)."""
    p = check_count("n_stages", n_stages, "pipeline stages")
    peaks = [0] * p
    if not any(s.attrs["op"] == "B" for s in compute_spans(spans)):
        return tuple(peaks)
    for rank in range(p):
        held = 0
        for s in sorted((s for s in compute_spans(spans) if s.rank == rank), key=lambda s: s.end_s):
            held += 1 if s.attrs["op"] == "F" else -1
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
