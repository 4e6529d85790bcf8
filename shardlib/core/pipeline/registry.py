"""The pipeline schedules, one ``ScheduleSpec`` each, and ``make_schedule`` that builds one from its spec.

A spec names its order function (``core.pipeline.orders``), chunks per device and placement, whether it
trains only, what ``m`` and ``v`` it needs, and its peak activations in flight, with sources; adding a
schedule is adding a spec (and its order). ``Schedule`` checks the list as it is built (every action
once, no deadlock). Sources: GPipe, Huang et al. 2019. 1F1B (PipeDream-Flush) and interleaved 1F1B:
Narayanan et al. 2021, its in-flight count Korthikanti et al. 2022, "Reducing Activation Recomputation",
section 4.2.3. ZB-H1, ZB-H2 and ZB-V: Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024); ZB-V
holds 2p half-stage chunks at its peak, exactly 1F1B's p microbatches (its section 6's point). DualPipeV:
Sea AI Lab's "cut-in-half" of DeepSeek-V3's DualPipe (report 3.2.1, credited in DualPipe's README), PP + 1
chunks at its peak. The published bubbles are in ``predict.bubbles``. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from shardlib.core.checks import flag, whole_number
from shardlib.core.pipeline.orders import (
    dualpipev_order,
    gpipe_order,
    interleaved_order,
    one_f_one_b_order,
    zb_h1_order,
    zb_h2_order,
    zb_v_order,
)
from shardlib.core.pipeline.schedules import Action, Schedule

Order = Callable[[int, int, int, bool], list[list[Action]]]  # (p, m, v, training) -> one list per stage


@dataclass(frozen=True)
class InFlight:
    """The peak activations a device holds at once, on its fullest stage, as the source states it:
    ``peak(p, m, v)`` in ``unit`` ("microbatches", each a whole stage's layers, or "chunk-microbatches",
    each one chunk's)."""

    peak: Callable[[int, int, int], float]
    unit: str
    source: str

    def chunks(self, p: int, m: int, v: int) -> float:
        """The peak in chunk-microbatches (what ``predict.pipeline.peak_in_flight`` counts)."""
        return self.peak(p, m, v) * (v if self.unit == "microbatches" else 1)


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule's facts. ``order(p, m, v, training)`` lists each stage's actions; ``chunks`` is the
    fixed number of model chunks per device, or ``None`` for any ``v >= 2`` (interleaved 1F1B);
    ``placement`` where those chunks sit ("loop" or "v", see ``Schedule``); ``split_backward``: B and W
    apart; ``needs(p, m, v)``: the problems with these counts, in words (empty when it can run);
    ``in_flight``: the peak memory."""

    name: str
    title: str
    source: str
    order: Order
    chunks: int | None
    placement: str
    training_only: bool
    split_backward: bool
    in_flight: InFlight
    needs: Callable[[int, int, int], tuple[str, ...]] = lambda p, m, v: ()

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



SPECS: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec(
        "gpipe", "GPipe", "Huang et al. 2019", lambda p, m, v, training: gpipe_order(p, m, training),
        chunks=1, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: m, "microbatches", "Narayanan et al. 2021, section 2.2.1: all m")),
    ScheduleSpec(
        "1f1b", "1F1B", "Narayanan et al. 2021 (PipeDream-Flush)",
        lambda p, m, v, training: one_f_one_b_order(p, m, training),
        chunks=1, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: min(p, m), "microbatches", "Narayanan et al. 2021, section 2.2.1: p")),
    ScheduleSpec(
        "interleaved-1f1b", "interleaved 1F1B", "Narayanan et al. 2021, section 2.2.2", interleaved_order,
        chunks=None, placement="loop", training_only=False, split_backward=False,
        in_flight=InFlight(lambda p, m, v: min(p + (p - 1) / v, m), "microbatches",
                           "Korthikanti et al. 2022, section 4.2.3: p (1 + (p-1)/(p v))"),
        needs=lambda p, m, v: (f"interleaved 1F1B sends microbatches through in groups of n_stages = {p}, so "
                               f"n_microbatches must be a multiple of {p}; got {m}",) if m % p else ()),
    ScheduleSpec(
        "zb-h1", "ZB-H1", "Qi et al. 2024, section 2.1", lambda p, m, v, training: zb_h1_order(p, m),
        chunks=1, placement="loop", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: min(p, m), "microbatches", "Qi et al. 2024, its handcrafted "
                           "schedules' table: p M_B, 1F1B's")),
    ScheduleSpec(
        "zb-h2", "ZB-H2", "Qi et al. 2024, section 2.2", lambda p, m, v, training: zb_h2_order(p, m),
        chunks=1, placement="loop", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: min(2 * p - 1, m), "microbatches", "Qi et al. 2024, its handcrafted "
                           "schedules' table: (2p-1) M_B"),
        needs=lambda p, m, v: (f"ZB-H2 runs 2 n_stages - 1 = {2 * p - 1} forwards on stage 0 before its first "
                               f"backward, so it needs n_microbatches >= {2 * p - 1}; got {m}",)
        if m < 2 * p - 1 else ()),
    ScheduleSpec(
        "zb-v", "ZB-V", "Qi et al. 2024, section 6", lambda p, m, v, training: zb_v_order(p, m),
        chunks=2, placement="v", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: p, "microbatches", "Qi et al. 2024, section 6: p M_B, 1F1B's exactly "
                           "(2p chunks of half a stage)")),
    ScheduleSpec(
        "dualpipev", "DualPipeV", "Sea AI Lab's cut-in-half of DualPipe (DeepSeek-V3 report, section 3.2.1)",
        lambda p, m, v, training: dualpipev_order(p, m),
        chunks=2, placement="v", training_only=True, split_backward=True,
        in_flight=InFlight(lambda p, m, v: 2 * p + 1, "chunk-microbatches", "DualPipe's README, its table of "
                           "bubbles and activations: PP + 1, PP = 2p (half a stage more than 1F1B's p)"),
        needs=lambda p, m, v: (f"DualPipeV needs at least 2 n_stages = {2 * p} microbatches to fill both legs of "
                               f"its V; got n_microbatches = {m}",) if m < 2 * p else ()),
)}

SCHEDULES = tuple(SPECS)  # every schedule's name, in the order they came
SPLIT_SCHEDULES = tuple(name for name, spec in SPECS.items() if spec.split_backward)  # B and W apart


def schedule_spec(name: str) -> ScheduleSpec:
    """The spec of schedule ``name``, or a ValueError listing the schedules."""
    if name not in SPECS:
        raise ValueError(f"no pipeline schedule called {name!r}; the schedules are {', '.join(map(repr, SCHEDULES))}")
    return SPECS[name]


def make_schedule(name: str, n_stages: int, n_microbatches: int, training: bool = True,
                  n_chunks: int = 1) -> Schedule:
    """Build and check the schedule ``name`` (one of ``SCHEDULES``) for ``n_stages`` stages and
    ``n_microbatches`` microbatches. ``n_chunks``: model chunks per device for interleaved 1F1B (at least
    2); the others take their own (1, or 2 for the V schedules). Refuses, in words, what the spec says the
    schedule cannot do (forward only for a split schedule, ``m < 2p`` for DualPipeV, ...)."""
    spec = schedule_spec(name)
    p = whole_number(n_stages, "n_stages (pipeline stages)")
    m = whole_number(n_microbatches, "n_microbatches (microbatches per step)")
    v = whole_number(n_chunks, "n_chunks (model chunks per device)")
    flag(training, "training (True: forward and backward; False: forward only)")
    problems = spec.problems(p, m, v, training)
    if problems:
        raise ValueError("\n".join(problems))
    chunks = spec.n_chunks(v)
    rows = spec.order(p, m, chunks, training)
    return Schedule(name, p, m, training, chunks, tuple(tuple(r) for r in rows), spec.placement, spec.title)
