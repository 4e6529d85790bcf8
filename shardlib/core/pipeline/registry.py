"""The pipeline schedules, one ``ScheduleSpec`` each: the one place a schedule's facts live.

A spec names its order function, chunks per device and placement, whether it trains only, what ``m`` and
``v`` it needs, its published bubble in both notations and its peak activations in flight, with sources.
Everything that needs a schedule's facts reads these; adding a schedule is adding a spec (and its order).

* GPipe: Huang et al. 2019. 1F1B (PipeDream-Flush): Narayanan et al. 2021, "Memory-Efficient
  Pipeline-Parallel DNN Training". Interleaved 1F1B and the bubbles of all three: Narayanan et al. 2021,
  "Efficient Large-Scale Language Model Training on GPU Clusters", sections 2.2.1-2.2.2; its in-flight
  count: Korthikanti et al. 2022, "Reducing Activation Recomputation", section 4.2.3.
* ZB-H1, ZB-H2 and ZB-V: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024). ZB-V holds 2p
  half-stage chunks at its peak: exactly 1F1B's p microbatches of a whole stage (its section 6's point).
* DualPipeV: Sea AI Lab's "cut-in-half" of DeepSeek-V3's DualPipe (report 3.2.1, credited in DualPipe's
  README), which hides one microbatch's communication under the other's compute; its bubble and memory
  (PP + 1 chunks, half a stage more than 1F1B) from DualPipe's README table. Two notations
  (``predict.bubbles``): Qi's B is the input gradient only, DualPipe's B the whole backward. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from shardlib.core.pipeline.classic import gpipe_order, interleaved_order, one_f_one_b_order
from shardlib.core.pipeline.schedules import Action
from shardlib.core.pipeline.zero_bubble import dualpipev_order, zb_h1_order, zb_h2_order, zb_v_order

EQUAL_WITHIN = 0.05  # F, B and W "equal" for ZB-V's claim when the largest is at most 5 % above the smallest
Order = Callable[[int, int, int, bool], list[list[Action]]]  # (p, m, v, training) -> one list per stage
Idle = Callable[[int, float, float, float], float]  # (p devices, F, B, W) -> idle seconds per device per step


@dataclass(frozen=True)
class Bubble:
    """A published bubble: idle time per device per step. ``qi`` writes it with Qi et al.'s B (the input
    gradient only), ``dualpipe`` with DualPipe's README's B (the whole backward, Qi's B + W); ``qi_idle``
    and ``dualpipe_idle`` evaluate each (F, B, W one action's, one chunk's, times; DualPipe's with its own B).
    ``window_idle``: the idle per device over one step's window, first action to last, as ``predict.bubbles``
    and the ranks measure it; ``None`` when it is ``qi_idle`` (see ZB-V's and ZB-H2's notes). ``condition``
    returns in words why the formula does not hold for these costs, or ``None``."""

    qi: str
    dualpipe: str
    source: str
    qi_idle: Idle | None
    dualpipe_idle: Idle | None
    window_idle: Idle | None = None
    holds: str = ""
    condition: Callable[[float, float, float], str | None] = lambda f, b, w: None

    def __post_init__(self) -> None:
        if self.qi_idle is None and self.window_idle is None:
            raise ValueError(f"a bubble needs a formula or a one-step value; {self.qi!r} has neither")

    def idle_s(self, p: int, f: float, b: float, w: float) -> float:
        """Idle per device over one step's window (``window_idle``, else the formula); a ValueError
        with the reason when ``condition`` says the formula does not hold for these costs."""
        problem = self.condition(f, b, w)
        if problem:
            raise ValueError(problem)
        return (self.window_idle or self.qi_idle)(p, f, b, w)


@dataclass(frozen=True)
class InFlight:
    """The peak activations a device holds at once, on its fullest stage, as the source states it:
    ``peak(p, m, v)`` in ``unit`` ("microbatches", each a whole stage's layers, or "chunk-microbatches",
    each one chunk's)."""

    peak: Callable[[int, int, int], float]
    unit: str
    source: str

    def __post_init__(self) -> None:
        if self.unit not in ("microbatches", "chunk-microbatches"):
            raise ValueError(f"in-flight unit is 'microbatches' or 'chunk-microbatches', got {self.unit!r}")

    def chunks(self, p: int, m: int, v: int) -> float:
        """The peak in chunk-microbatches (what ``predict.pipeline.peak_in_flight`` counts)."""
        return self.peak(p, m, v) * (v if self.unit == "microbatches" else 1)


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule's facts. ``order(p, m, v, training)`` lists each stage's actions; ``chunks`` is the
    fixed number of model chunks per device, or ``None`` for any ``v >= 2`` (interleaved 1F1B);
    ``placement`` where those chunks sit ("loop" or "v", see ``Schedule``); ``split_backward``: B and W
    apart; ``needs(p, m, v)``: the problems with these counts, in words (empty when it can run);
    ``bubble``: the published bubble, or ``None`` with ``no_bubble`` saying why; ``in_flight``: the peak
    memory; ``also_called``: another name in the literature (DualPipe's README's ZB1P)."""

    name: str
    title: str
    source: str
    order: Order
    chunks: int | None
    placement: str
    training_only: bool
    split_backward: bool
    in_flight: InFlight
    bubble: Bubble | None = None
    no_bubble: str = ""
    needs: Callable[[int, int, int], tuple[str, ...]] = lambda p, m, v: ()
    also_called: str = ""

    def __post_init__(self) -> None:  # its placement and chunks are checked by ``Schedule`` as it is built
        if self.bubble is None and not self.no_bubble:
            raise ValueError(f"{self.name}: give a published bubble or say in no_bubble why there is none")

    def problems(self, p: int, m: int, v: int, training: bool) -> tuple[str, ...]:
        """What stops this schedule running with ``p`` stages, ``m`` microbatches and ``v`` chunks asked
        for (``v = 1``: not asked, the schedule's own), in words; empty when it can run."""
        found = []
        if self.training_only and not training:
            found.append(f"{self.title} reorders the backward's two halves; forward only, it is plain 1F1B: use '1f1b'")
        if self.chunks is None and v < 2:
            found.append(f"{self.title} needs at least 2 model chunks per device, got n_chunks = {v}; with one "
                         "chunk it is plain 1F1B")
        elif self.chunks == 1 and v != 1:
            found.append(f"{self.title} gives each device one model chunk; n_chunks = {v} needs 'interleaved-1f1b'")
        elif self.chunks is not None and v not in (1, self.chunks):
            found.append(f"{self.title} gives each device {self.chunks} model chunks; got n_chunks = {v}")
        return tuple(found) + tuple(self.needs(p, m, v))

    def n_chunks(self, v: int = 1) -> int:
        """Chunks per device of a schedule built with ``n_chunks = v``."""
        return v if self.chunks is None else self.chunks


def _interleaved_needs(p: int, m: int, v: int) -> tuple[str, ...]:
    return (f"interleaved 1F1B sends microbatches through in groups of n_stages = {p}, so n_microbatches must be "
            f"a multiple of {p}; got {m}",) if m % p else ()


def _dualpipev_needs(p: int, m: int, v: int) -> tuple[str, ...]:
    return (f"DualPipeV needs at least 2 n_stages = {2 * p} microbatches to fill both legs of its V; got "
            f"n_microbatches = {m}",) if m < 2 * p else ()


def _zb_h2_needs(p: int, m: int, v: int) -> tuple[str, ...]:
    return (f"ZB-H2 runs 2 n_stages - 1 = {2 * p - 1} forwards on stage 0 before its first backward, so it needs "
            f"n_microbatches >= {2 * p - 1}; got {m}",) if m < 2 * p - 1 else ()


def _equal_costs(f: float, b: float, w: float) -> str | None:
    if max(f, b, w) > (1 + EQUAL_WITHIN) * min(f, b, w):
        return (f"ZB-V's published bubble (zero) holds only for F = B = W; got F {f:.4g}, B {b:.4g}, W {w:.4g} "
                "(simulate gives this list's bubble for any costs)")
    return None


NARAYANAN = "Narayanan et al. 2021, section 2.2.1: (p-1)(t_f+t_b)"
DUALPIPE_TABLE = "DualPipe's README, its table of bubbles and activations"
REWRITTEN = "; DualPipe's column rewritten with its B = B + W (not in its table)"

SPECS: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec(
        "gpipe", "GPipe", "Huang et al. 2019", lambda p, m, v, training: gpipe_order(p, m, training),
        chunks=1, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: m, "microbatches", "Narayanan et al. 2021, section 2.2.1: all m"),
        bubble=Bubble("(p-1)(F+B+W)", "(PP-1)(F+B)", NARAYANAN + REWRITTEN,
                      lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b))),
    ScheduleSpec(
        "1f1b", "1F1B", "Narayanan et al. 2021 (PipeDream-Flush)",
        lambda p, m, v, training: one_f_one_b_order(p, m, training),
        chunks=1, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: min(p, m), "microbatches", "Narayanan et al. 2021, section 2.2.1: p"),
        bubble=Bubble("(p-1)(F+B+W)", "(PP-1)(F+B)", f"{NARAYANAN}; {DUALPIPE_TABLE}",
                      lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b))),
    ScheduleSpec(
        "interleaved-1f1b", "interleaved 1F1B", "Narayanan et al. 2021, section 2.2.2", interleaved_order,
        chunks=None, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: min(p + (p - 1) / v, m), "microbatches",
                           "Korthikanti et al. 2022, section 4.2.3: p (1 + (p-1)/(p v))"),
        bubble=Bubble("(p-1)(F+B+W), F, B, W one chunk's", "(PP-1)(F+B), one chunk's",
                      "Narayanan et al. 2021, section 2.2.2: (p-1)(t_f+t_b)/v" + REWRITTEN,
                      lambda p, f, b, w: (p - 1) * (f + b + w), lambda p, f, b, w: (p - 1) * (f + b),
                      holds="m a multiple of p"),
        needs=_interleaved_needs),
    ScheduleSpec(
        "zb-h1", "ZB-H1", "Qi et al. 2024, section 2.1", lambda p, m, v, training: zb_h1_order(p, m),
        chunks=1, placement="loop", training_only=True, split_backward=True, also_called="ZB1P",
        in_flight=InFlight(lambda p, m, v: min(p, m), "microbatches", "Qi et al. 2024, its handcrafted "
                           "schedules' table: p M_B, 1F1B's"),
        bubble=Bubble("(p-1)(F+B-W)", "(PP-1)(F+B-2W)", f"Qi et al. 2024, its handcrafted schedules' table; "
                      f"{DUALPIPE_TABLE} (ZB1P)", lambda p, f, b, w: (p - 1) * (f + b - w),
                      lambda p, f, b, w: (p - 1) * (f + b - 2 * w),
                      holds="m >= p, W no dearer than F or B (a dearer W has no wait left to fill)")),
    ScheduleSpec(
        "zb-h2", "ZB-H2", "Qi et al. 2024, section 2.2", lambda p, m, v, training: zb_h2_order(p, m),
        chunks=1, placement="loop", training_only=True, split_backward=True, also_called="ZB2P",
        in_flight=InFlight(lambda p, m, v: min(2 * p - 1, m), "microbatches", "Qi et al. 2024, its handcrafted "
                           "schedules' table: (2p-1) M_B"),
        bubble=Bubble("(p-1)(F+B-2W)", "(PP-1)(F+B-3W)", "Qi et al. 2024, its handcrafted schedules' table" + REWRITTEN,
                      lambda p, f, b, w: (p - 1) * (f + b - 2 * w), lambda p, f, b, w: (p - 1) * (f + b - 3 * w),
                      window_idle=lambda p, f, b, w: (p - 1) * max(f, f + b - 2 * w),
                      holds="m >= 2p - 1, W no dearer than F or B. The formula is the fullest stage's idle inside "
                      "its own span (the spans a parallelogram, each F after the one before): a step's cost once "
                      "steps overlap (the paper's post-validation). One step's window keeps the ramp, (p-1) F, "
                      "when that is longer"),
        needs=_zb_h2_needs),
    ScheduleSpec(
        "zb-v", "ZB-V", "Qi et al. 2024, section 6", lambda p, m, v, training: zb_v_order(p, m),
        chunks=2, placement="v", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: p, "microbatches", "Qi et al. 2024, section 6: p M_B, 1F1B's exactly "
                           "(2p chunks of half a stage)"),
        bubble=Bubble("none published: 'zero bubble' at F = B = W, m >= 2p", "not in the table",
                      "Qi et al. 2024, section 6, and its authors' README: no formula", None, None,
                      window_idle=lambda p, f, b, w: (p - 1) * f,
                      holds="F = B = W: zero inside each device's span; one step's window keeps the ramp (p-1) F "
                      "(this course's count from the list, not a published figure)",
                      condition=_equal_costs)),
    ScheduleSpec(
        "dualpipev", "DualPipeV", "Sea AI Lab's cut-in-half of DualPipe (DeepSeek-V3 report, section 3.2.1)",
        lambda p, m, v, training: dualpipev_order(p, m),
        chunks=2, placement="v", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: 2 * p + 1, "chunk-microbatches", f"{DUALPIPE_TABLE}: PP + 1, PP = 2p "
                           "(half a stage more than 1F1B's p)"),
        bubble=Bubble("(p-1)(F+2B-W), F&B run as F then B", "(PP/2-1)(F&B+B-3W), PP = 2p stages",
                      DUALPIPE_TABLE, lambda p, f, b, w: (p - 1) * (f + 2 * b - w),
                      lambda p, f, b, w: (p - 1) * ((f + b) + b - 3 * w),
                      holds="F&B taken as F plus the whole backward: here they run in turn"),
        needs=_dualpipev_needs),
)}

SCHEDULES = tuple(SPECS)  # every schedule's name, in the order they came


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of schedule ``name``, or a ValueError listing the schedules."""
    if name not in SPECS:
        raise ValueError(f"no pipeline schedule called {name!r}; the schedules are {', '.join(map(repr, SCHEDULES))}")
    return SPECS[name]


def split_schedules() -> tuple[str, ...]:
    """The schedules with the backward split in B and W."""
    return tuple(name for name, spec in SPECS.items() if spec.split_backward)
