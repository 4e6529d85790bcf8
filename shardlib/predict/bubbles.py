"""The published bubbles (``BUBBLES``), in both notations, over one step's window; F, B and W from a run.

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
from typing import Callable, Sequence

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.pipeline.registry import SPLIT_SCHEDULES, schedule_spec
from shardlib.core.pipeline.schedules import Action, Schedule, simulate
from shardlib.predict.pipeline import compute_spans
from shardlib.runtime.timeline import Span

EQUAL_WITHIN = 0.05  # F, B and W "equal" for ZB-V's claim when the largest is at most 5 % above the smallest
Idle = Callable[[int, float, float, float], float]  # (p devices, F, B, W) -> idle seconds per device per step


@dataclass(frozen=True)
class Bubble:
    """A published bubble: idle time per device per step. ``qi`` writes it with Qi et al.'s B (the input
    gradient only), ``dualpipe`` with DualPipe's README's B (the whole backward, Qi's B + W); ``qi_idle``
    and ``dualpipe_idle`` evaluate each (F, B, W one action's, one chunk's, times; DualPipe's with its own B).
    ``window_idle``: the idle per device over one step's window, first action to last, as the ranks
    measure it; ``None`` when it is ``qi_idle`` (see ZB-V's and ZB-H2's notes). ``condition`` returns in
    words why the formula does not hold for these costs, or ``None``. ``also_called``: another name in the
    literature (DualPipe's README's ZB1P)."""

    qi: str
    dualpipe: str
    source: str
    qi_idle: Idle | None
    dualpipe_idle: Idle | None
    window_idle: Idle | None = None
    holds: str = ""
    condition: Callable[[float, float, float], str | None] = lambda f, b, w: None
    also_called: str = ""


def _equal_costs(f: float, b: float, w: float) -> str | None:
    if max(f, b, w) > (1 + EQUAL_WITHIN) * min(f, b, w):
        return (f"ZB-V's published bubble (zero) holds only for F = B = W; got F {f:.4g}, B {b:.4g}, W {w:.4g} "
                "(simulate gives this list's bubble for any costs)")
    return None


NARAYANAN = "Narayanan et al. 2021, section 2.2.1: (p-1)(t_f+t_b)"
DUALPIPE_TABLE = "DualPipe's README, its table of bubbles and activations"
REWRITTEN = "; DualPipe's column rewritten with its B = B + W (not in its table)"

BUBBLES: dict[str, Bubble] = {  # by schedule name (``core.pipeline.registry``)
    "gpipe": Bubble("(p-1)(F+B+W)", "(PP-1)(F+B)", NARAYANAN + REWRITTEN,
                    lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b)),
    "1f1b": Bubble("(p-1)(F+B+W)", "(PP-1)(F+B)", f"{NARAYANAN}; {DUALPIPE_TABLE}",
                   lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b)),
    "interleaved-1f1b": Bubble("(p-1)(F+B+W), F, B, W one chunk's", "(PP-1)(F+B), one chunk's",
                               "Narayanan et al. 2021, section 2.2.2: (p-1)(t_f+t_b)/v" + REWRITTEN,
                               lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b),
                               holds="m a multiple of p"),
    "zb-h1": Bubble("(p-1)(F+B-W)", "(PP-1)(F+B-2W)", f"Qi et al. 2024, its handcrafted schedules' table; "
                    f"{DUALPIPE_TABLE} (ZB1P)", lambda p, f, b, w: (p - 1) * (f + b - w),
                    lambda p, f, b, w: (p - 1) * (f + b - 2 * w), also_called="ZB1P",
                    holds="m >= p, W no dearer than F or B (a dearer W has no wait left to fill)"),
    "zb-h2": Bubble("(p-1)(F+B-2W)", "(PP-1)(F+B-3W)", "Qi et al. 2024, its handcrafted schedules' table" + REWRITTEN,
                    lambda p, f, b, w: (p - 1) * (f + b - 2 * w), lambda p, f, b, w: (p - 1) * (f + b - 3 * w),
                    window_idle=lambda p, f, b, w: (p - 1) * max(f, f + b - 2 * w), also_called="ZB2P",
                    holds="m >= 2p - 1, W no dearer than F or B. The formula is the fullest stage's idle inside "
                    "its own span (the spans a parallelogram, each F after the one before): a step's cost once "
                    "steps overlap (the paper's post-validation). One step's window keeps the ramp, (p-1) F, "
                    "when that is longer"),
    "zb-v": Bubble("none published: 'zero bubble' at F = B = W, m >= 2p", "not in the table",
                   "Qi et al. 2024, section 6, and its authors' README: no formula", None, None,
                   window_idle=lambda p, f, b, w: (p - 1) * f,
                   holds="F = B = W: zero inside each device's span; one step's window keeps the ramp (p-1) F "
                   "(this course's count from the list, not a published figure)", condition=_equal_costs),
    "dualpipev": Bubble("(p-1)(F+2B-W), F&B run as F then B", "(PP/2-1)(F&B+B-3W), PP = 2p stages",
                        DUALPIPE_TABLE, lambda p, f, b, w: (p - 1) * (f + 2 * b - w),
                        lambda p, f, b, w: (p - 1) * ((f + b) + b - 3 * w),
                        holds="F&B taken as F plus the whole backward: here they run in turn"),
}


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
    """Per device, the idle time of one step by the published formula (``BUBBLES[name]``, where it holds:
    its ``holds`` and ``condition``), in Qi's notation (B the input gradient), over one step's window
    (``window_idle``, else the formula). ZB-V has no published formula, only "zero bubble" at F = B = W;
    within one step's window the ramp stays, ``(p-1) F`` per device, and F, B and W must be equal within
    ``EQUAL_WITHIN``."""
    spec, p = schedule_spec(name), whole_number(n_stages, "n_stages (pipeline stages, devices)")
    bubble = BUBBLES[spec.name]
    problem = bubble.condition(costs.forward_s, costs.backward_s, costs.weight_s)
    if problem:
        raise ValueError(problem)
    return (bubble.window_idle or bubble.qi_idle)(p, costs.forward_s, costs.backward_s, costs.weight_s)


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
        spec, bubble = schedule_spec(name), BUBBLES[name]
        if bubble.qi_idle is None or bubble.dualpipe_idle is None:
            raise ValueError(f"{spec.title} has no published formula to write two ways")
        label = spec.title + (f" / {bubble.also_called}" if bubble.also_called else "")
        rows.append((label, bubble.qi, bubble.qi_idle(p, f, b, w), bubble.dualpipe,
                     bubble.dualpipe_idle(p, f, full, w)))
    return rows


def op_costs(spans: Sequence[Span]) -> OpCosts:
    """The median F, B and W of a run with the backward split, from its compute spans."""
    times = {op: [s.duration_s for s in compute_spans(spans) if s.attrs["op"] == op] for op in "FBW"}
    if not all(times.values()):
        raise ValueError("need F, B and W spans: run a schedule with the backward split "
                         f"({', '.join(SPLIT_SCHEDULES)})")
    return OpCosts(*(statistics.median(times[op]) for op in "FBW"))


def handover_s(spans: Sequence[Span], schedule: Schedule) -> float:
    """The median hand-over of a run: from the end of an action on one stage to the end of the wait of the
    action on the next stage that needed its result, over the waits that began before that result was
    ready (the consumer was waiting on it). 0.0 when no action waited."""
    ends = {(s.rank, s.attrs["microbatch"], s.attrs["op"], s.attrs["chunk"]): s.end_s for s in compute_spans(spans)}
    gaps = []
    for s in spans:
        if s.kind != "wait" or "source" not in s.attrs:
            continue
        dep = schedule.producer(Action(s.rank, s.attrs["microbatch"], s.attrs["op"], s.attrs["chunk"]))
        end = ends.get((dep.stage, dep.microbatch, dep.op, dep.chunk))
        if end is not None and s.start_s < end <= s.end_s:
            gaps.append(s.end_s - end)
    return statistics.median(gaps) if gaps else 0.0
