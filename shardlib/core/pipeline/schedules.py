"""Pipeline schedules as data: ``Action``, ``Schedule``, ``check_schedule``, and ``simulate`` that times them.

A schedule lists, for each stage, the ``Action`` s it runs in order: the forward (``"F"``), the backward
(``"B"``) and, when the backward is split, the weight gradient (``"W"``) of one microbatch on one model
chunk. The same ``Schedule`` drives the real run on ranks (``core.pipeline.engine``), the predictions and the
figures. Each schedule's facts and order are in ``core.pipeline.registry``; ``make_schedule`` builds from them.
``simulate`` lives here because building a schedule runs it: an order that would leave a stage waiting
forever is refused before any rank sees it. Pure: no ``torch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import Sequence

from shardlib.core.checks import number_at_least, one_per, whole_number

OPS = ("F", "B", "W")
PLACEMENTS = ("loop", "v")  # where a stage's chunks sit among the virtual stages (see ``Schedule``)


# -- schedules as data -----------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Action:
    """One unit of pipeline work: stage ``stage`` runs the forward (``"F"``), backward (``"B"``) or
    weight gradient (``"W"``) of microbatch ``microbatch`` through its model chunk ``chunk`` (0 with one
    chunk). In a schedule with W actions, B is the input gradient only (Qi et al. 2024's B); without
    them B is the whole backward, input and weight gradients together (DualPipe's README's B)."""

    stage: int
    microbatch: int
    op: str
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"an action's op is 'F' (forward), 'B' (backward) or 'W' (weight gradient), "
                             f"got {self.op!r}")

    @property
    def label(self) -> str:
        """``F3`` (forward of microbatch 3), ``B0.1`` (backward of microbatch 0 on chunk 1)."""
        return f"{self.op}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


@dataclass(frozen=True)
class Schedule:
    """Per stage, the ordered actions it runs in one step. Build one with ``make_schedule``.

    ``actions[s]`` is stage ``s``'s list. A microbatch's forward visits virtual stages ``0, 1, ...
    p v - 1`` in order, its backward the reverse. ``placement`` says where they sit: ``"loop"``, stage
    ``s`` chunk ``c`` is virtual stage ``c p + s`` (interleaved 1F1B); ``"v"`` (two chunks), chunk 0 is
    ``s`` and chunk 1 is ``2 p - 1 - s``, so the last virtual stage is back on stage 0 (ZB-V, DualPipeV).
    A W runs on the stage of its B, any time after it. Building one checks the lists
    (``check_schedule``): every action exactly once, and an order that runs without deadlock.
    """

    name: str
    n_stages: int
    n_microbatches: int
    training: bool
    n_chunks: int
    actions: tuple[tuple[Action, ...], ...] = field(repr=False)
    placement: str = "loop"
    short_title: str = ""  # as people write it: ``GPipe``, ``1F1B``; ``make_schedule`` takes it from the registry

    def __post_init__(self) -> None:
        whole_number(self.n_stages, "n_stages (pipeline stages)")
        whole_number(self.n_microbatches, "n_microbatches (microbatches per step)")
        whole_number(self.n_chunks, "n_chunks (model chunks per device)")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement is 'loop' or 'v', got {self.placement!r}")
        if self.placement == "v" and self.n_chunks != 2:
            raise ValueError(f"the V placement gives each stage 2 chunks (down, then back up); got n_chunks = "
                             f"{self.n_chunks}")
        check_schedule(self)

    @property
    def split_backward(self) -> bool:
        """Whether the backward is split: B the input gradient, W the weight gradient (any W action)."""
        return any(a.op == "W" for row in self.actions for a in row)

    @property
    def title(self) -> str:
        kind = "training" if self.training else "inference (forward only)"
        chunks = f", v = {self.n_chunks}" if self.n_chunks > 1 else ""
        return f"{self.short_title or self.name}, {kind}: p = {self.n_stages}, m = {self.n_microbatches}{chunks}"

    @property
    def n_virtual_stages(self) -> int:
        return self.n_stages * self.n_chunks

    def virtual_stage_of(self, stage: int, chunk: int) -> int:
        """Which virtual stage (slice of the layer stack) stage ``stage`` runs as chunk ``chunk``."""
        return _virtual_stage(stage, chunk, self.n_stages, self.placement)

    def virtual_stage(self, action: Action) -> int:
        return self.virtual_stage_of(action.stage, action.chunk)

    def at_virtual_stage(self, virtual_stage: int, microbatch: int, op: str) -> Action:
        return _at_virtual_stage(virtual_stage, microbatch, op, self.n_stages, self.placement)

    def producer(self, action: Action) -> Action | None:
        return producer_of(action, self.n_stages, self.n_chunks, self.placement)

    def destination(self, action: Action) -> int | None:
        """The stage that ``action``'s result is sent to, or ``None`` when nothing is sent (the last
        forward's output and the first backward's input gradient are the step's results; a W sends nothing)."""
        vs = self.virtual_stage(action)
        nxt = vs + 1 if action.op == "F" else vs - 1
        if action.op == "W" or not 0 <= nxt < self.n_virtual_stages:
            return None
        return self.at_virtual_stage(nxt, action.microbatch, action.op).stage

    def messages(self, src: int, dst: int) -> tuple[Action, ...]:
        """The actions of stage ``src`` whose results travel to stage ``dst``, in the order ``src``
        sends them. A receiver reads its messages in this order (point-to-point messages between two
        ranks arrive in the order they were sent)."""
        return tuple(a for a in self.actions[src] if self.destination(a) == dst and dst != src)


def _virtual_stage(stage: int, chunk: int, p: int, placement: str) -> int:
    return 2 * p - 1 - stage if placement == "v" and chunk == 1 else chunk * p + stage


def _at_virtual_stage(vs: int, microbatch: int, op: str, p: int, placement: str) -> Action:
    chunk, stage = divmod(vs, p)
    return Action(p - 1 - stage if placement == "v" and chunk == 1 else stage, microbatch, op, chunk)


def producer_of(a: Action, p: int, v: int = 1, placement: str = "loop") -> Action | None:
    """The action whose result ``a`` consumes, with ``p`` stages of ``v`` chunks placed by ``placement``:
    the previous virtual stage's F for an F, the next one's B for a B (the last virtual stage's own F of
    that microbatch), its own B for a W; ``None`` for the first forward. The orders use it before their
    ``Schedule`` exists."""
    if a.op == "W":
        return Action(a.stage, a.microbatch, "B", a.chunk)
    vs = _virtual_stage(a.stage, a.chunk, p, placement)
    if a.op == "F":
        return None if vs == 0 else _at_virtual_stage(vs - 1, a.microbatch, "F", p, placement)
    if vs == p * v - 1:
        return _at_virtual_stage(vs, a.microbatch, "F", p, placement)
    return _at_virtual_stage(vs + 1, a.microbatch, "B", p, placement)


class ScheduleError(ValueError):
    """A schedule that cannot run, and why: ``kind`` names the mistake ("wrong stage", "not in this step",
    "twice", "receive with no send", "never runs", "W before its B" or "deadlock")."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def check_schedule(schedule: Schedule) -> None:
    """Raise ``ScheduleError`` (a ValueError) unless every stage's list holds exactly its own actions, each
    once (no backwards when forward-only; a W for every B, or none at all), every W after its B, in an
    order that can run: no stage waits on a result that can only come after it (``simulate`` finds it)."""
    p, m, v = schedule.n_stages, schedule.n_microbatches, schedule.n_chunks
    if len(schedule.actions) != p:
        raise ValueError(f"a schedule for {p} stages needs {p} action lists, got {len(schedule.actions)}")
    ops = ("F",) if not schedule.training else OPS if schedule.split_backward else ("F", "B")
    expected = {Action(s, i, op, c) for s in range(p) for i in range(m) for op in ops for c in range(v)}
    seen: dict[Action, int] = {}
    for s, row in enumerate(schedule.actions):
        for k, a in enumerate(row):
            if a.stage != s:
                raise ScheduleError("wrong stage", f"stage {s}'s list holds {a.label} of stage {a.stage}")
            if a not in expected:
                raise ScheduleError("not in this step", f"stage {s} runs {a.label}, which is not part of this step "
                                    f"(m = {m}, v = {v}, {'training' if schedule.training else 'forward only'})")
            if a in seen:
                raise ScheduleError("twice", f"stage {s} runs {a.label} twice")
            seen[a] = k
    missing = sorted(expected - set(seen))
    if missing:
        shown = ", ".join(f"stage {a.stage} {a.label}" for a in missing[:5])
        message = f"{len(missing)} actions never run: {shown}{' ...' if len(missing) > 5 else ''}"
        orphans = [(a, dep) for a in seen if (dep := schedule.producer(a)) is not None and dep.stage != a.stage
                   and dep not in seen]  # a result taken from another stage that never produces it
        if not orphans:
            raise ScheduleError("never runs", message)
        a, dep = min(orphans)
        raise ScheduleError("receive with no send", f"{message}; stage {a.stage}'s {a.label} waits for {dep.label} "
                            f"from stage {dep.stage}, which never sends it: a receive with no send")
    for a, k in seen.items():
        if a.op == "W" and seen[schedule.producer(a)] > k:
            raise ScheduleError("W before its B", f"stage {a.stage} runs {a.label} before "
                                f"{schedule.producer(a).label}: a weight gradient needs its backward's output "
                                "gradients, so W comes after its B")
    simulate(schedule)  # raises if the order deadlocks


# -- predictions from a schedule -------------------------------------------------------------------
@dataclass(frozen=True)
class TimedAction:
    """An action with its start and end times (in whatever unit the durations were given)."""

    action: Action
    start_s: float
    end_s: float


def per_stage(value, n_stages: int, name: str) -> list:
    """Seconds per op, one per stage: ``value`` for every stage, or a list of one per stage; ``None`` (no
    time set: real compute) for every stage when ``value`` is ``None``."""
    if value is None:
        return [None] * n_stages
    values = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else [value] * n_stages
    values = one_per(values, n_stages, name, "stage")
    for x in values:
        number_at_least(x, f"{name} (seconds per op)")
    return values


def _exact(value, n_stages: int, name: str) -> list:
    """``per_stage`` for a timing: a number is required; whole numbers stay exact (slot counting), the rest float."""
    if value is None:
        raise ValueError(f"{name} (seconds per op) must be a number to time the schedule, got None")
    return [Fraction(x) if isinstance(x, (Integral, Fraction)) else float(x) for x in per_stage(value, n_stages, name)]


def simulate(schedule: Schedule, forward_s=1, backward_s=1, hop_s=0, weight_s=None) -> list[TimedAction]:
    """When each action runs if every stage works through its list in order, starting each action as
    soon as the stage is free and the action's input has arrived.

    ``forward_s``, ``backward_s`` and ``weight_s`` are one stage's time for the forward, the input
    gradient and the weight gradient of one microbatch through all its layers: a number, or one per
    stage. With ``weight_s`` given, a schedule without W actions runs the whole backward as its B
    (``backward_s + weight_s``); with ``weight_s=None`` every B and every W lasts ``backward_s``. With ``v``
    chunks a chunk's op takes ``1/v`` of it. ``hop_s`` is added to every message between stages.
    Whole-number durations give exact results (fractions). Raises ``ScheduleError`` on a deadlock.
    """
    p, v = schedule.n_stages, schedule.n_chunks
    fwd, bwd = _exact(forward_s, p, "forward_s"), _exact(backward_s, p, "backward_s")
    wgt = bwd if weight_s is None else _exact(weight_s, p, "weight_s")
    if weight_s is not None and not schedule.split_backward:
        bwd = [b + w for b, w in zip(bwd, wgt)]  # B is the whole backward here
    cost = {"F": fwd, "B": bwd, "W": wgt}
    hop = _exact(hop_s, 1, "hop_s")[0]
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
                end = start + cost[a.op][s] / v
                done[a], free[s] = end, end
                timed.append(TimedAction(a, start, end))
                pos[s] += 1
                progressed = True
        if not progressed:
            stuck = [(s, row[pos[s]], schedule.producer(row[pos[s]])) for s, row in enumerate(schedule.actions)
                     if pos[s] < len(row)]
            raise ScheduleError("deadlock", "this order deadlocks: " + "; ".join(
                f"stage {s} waits at {a.label} for {dep.label} of stage {dep.stage}" for s, a, dep in stuck))
    return timed
