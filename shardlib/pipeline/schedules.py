"""Pipeline schedules as data: ``Action``, ``Schedule``, ``check_schedule``, and ``simulate`` that times them.

A schedule lists, for each stage, the ``Action`` s it runs in order: the forward (``"F"``) or backward
(``"B"``) of one microbatch on one model chunk. The same ``Schedule`` drives the real run on ranks
(``pipeline.engine``), the predictions and the figures. The orders themselves (GPipe, 1F1B, interleaved
1F1B, after Huang et al. 2019 and Narayanan et al. 2021) are built in ``pipeline.orders``.
``simulate`` lives here because building a schedule runs it: an order that would leave a stage waiting
forever is refused before any rank sees it. Pure: no ``torch``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from numbers import Integral
from typing import Sequence

from ..checks import number_at_least, one_per, whole_number

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
