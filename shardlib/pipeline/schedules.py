"""Pipeline schedules as data, and the simulation that times them.

A schedule is data: for each stage, the ordered list of ``Action`` s it runs (forward ``"F"`` or
backward ``"B"`` of one microbatch, on one model chunk). The same ``Schedule`` drives the real run on
ranks (``pipeline.ranks``) and the figures (``ui.pipeline_figures``), and ``simulate`` turns it into
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
is only where the backwards go. ``simulate`` lives beside the schedules because building a schedule
runs it: an order that would leave a stage waiting forever is refused before any rank sees it.

Pure: no ``torch``, no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import Sequence

from ..checks import flag, number_at_least, one_per, whole_number

OPS = ("F", "B")
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
SCHEDULE_TITLES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "interleaved 1F1B"}


def check_count(name: str, value, what: str) -> int:
    """``value`` as an int, or a ValueError saying it must be a whole number of at least 1."""
    return whole_number(value, f"{name} ({what})")


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
        return f"{self.short_title}, {kind}: p = {self.n_stages}, m = {self.n_microbatches}{chunks}"

    @property
    def short_title(self) -> str:
        """The schedule's name as people write it: ``GPipe``, ``1F1B``, ``interleaved 1F1B``."""
        return SCHEDULE_TITLES.get(self.name, self.name)

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
    flag(training, "training (True: forward and backward; False: forward only)")
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
    values = one_per(values, n_stages, name, "stage")
    for x in values:
        number_at_least(x, f"{name} (seconds per op)")
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
