"""Pipeline claims measured on a pool: the bubble of split schedules, and the claims notebook 03 prints.

* ``run_split_bubble``: one schedule's idle share (median of ``repeats`` steps, F, B and W padded to set
  costs) against the published formula and ``simulate`` of the same list, with and without the hand-over
  measured between stages (``bubbles.handover_s``), gathered into a ``SplitBubble``.
* ``run_bubble_check`` (GPipe's idle fraction on 2 and 4 stages against ``(p - 1) / (m + p - 1)``),
  ``run_pace_check`` (a slow stage sets the pace), ``run_uneven_check`` (unequal stages, exact, each cut at
  its slowest stage's pace) and ``run_trip_check`` (a microbatch's trip through every stage, one departure
  per stage-time): each returns its ``lab.verdict.Verdict`` s, one line per claim (predicted, measured,
  ratio, verdict), measured again while one fails and failing when strict (``verified``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.schedules import Schedule, check_count
from shardlib.lab.pipeline.drivers import BubbleCurve, BubblePoint, PipelineRun, run_pipeline
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.bubbles import PUBLISHED, OpCosts, handover_s, op_costs, published_fraction, simulated_fraction
from shardlib.predict.pipeline import (
    Trips,
    microbatch_trips,
    pipeline_bubble_fraction,
    pipeline_step_s,
    predicted_step_s,
)


@dataclass(frozen=True)
class SplitBubble:
    """One schedule's idle share on the ranks (``attempts``, their median ``measured``), the costs
    measured on a zero-bubble run of the same pads (``costs``, per action), the published formula (``None``
    where none applies: ZB-V's needs F = B = W) and ``simulate`` evaluated with them, ``simulate`` with the
    measured ``handover_s`` on every message (``with_hops``), and the peak chunks in flight per stage."""

    name: str
    n_stages: int
    n_microbatches: int
    costs: OpCosts
    attempts: tuple[float, ...]
    published: float | None
    simulated: float
    peak_in_flight: tuple[int, ...]
    handover_s: float = 0.0
    with_hops: float | None = None

    @property
    def measured(self) -> float:
        return statistics.median(self.attempts)


def run_split_bubble(ranks, name: str, n_microbatches: int, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor, op_s: float, weight_s: float, repeats: int = 3,
                     costs: OpCosts | None = None) -> SplitBubble:
    """Measure schedule ``name``'s idle share with each stage's F and B padded to ``op_s`` and W to
    ``weight_s``. The costs the formulas use are read from the spans (of this run, or for 1F1B, whose
    backward is whole, of a ZB-H1 run with the same pads), unless given: ``costs`` of an earlier
    ``SplitBubble`` with the same pads saves that run."""
    repeats = check_count("repeats", repeats, "steps to take the median of")
    schedule = make_schedule(name, ranks.world_size, n_microbatches)

    def step() -> PipelineRun:
        return run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s, weight_s=weight_s)

    runs = [step() for _ in range(repeats)]
    if costs is None and schedule.split_backward:
        costs = op_costs(runs[0].spans)
    elif costs is None:
        twin = make_schedule("zb-h1", ranks.world_size, n_microbatches)
        costs = op_costs(run_pipeline(ranks, twin, model, layers, x, grad_output, op_s, op_s, weight_s=weight_s).spans)
    try:
        published = published_fraction(schedule, costs) if name in PUBLISHED else None
    except ValueError:  # the formula's condition does not hold (ZB-V's F = B = W)
        published = None
    hop_s = statistics.median(handover_s(r.spans, schedule) for r in runs)
    return SplitBubble(name, schedule.n_stages, n_microbatches, costs, tuple(r.bubble.idle_fraction for r in runs),
                       published, simulated_fraction(schedule, costs), runs[0].peak_in_flight, hop_s,
                       simulated_fraction(schedule, costs, hop_s))


# -- the checks notebook 03 prints: one line per claim (predicted, measured, ratio, verdict) -----------------
BUBBLE_BAND = (0.9, 1.6)  # messages only add idle time, and at m = 16 the bubble itself is a few percent
STEP_BAND = (0.95, 1.3)  # a padded step: hops and bookkeeping only add time
RATIO_BAND = (0.85, 1.15)  # two steps of one run against each other: the hops mostly cancel


def _warm(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, grad_output) -> None:
    """One short step on fresh ranks: the first backward on a new process is slow (imports, first messages)."""
    run_pipeline(ranks, make_schedule("gpipe", ranks.world_size, 1, training=grad_output is not None), model,
                 layers, x, grad_output, forward_s=0.001, backward_s=0.001 if grad_output is not None else None)


def _fastest(steps: dict, rounds: int) -> dict:
    """Run each labelled step in turn, round after round, and keep each one's fastest round (with every op
    padded to a set duration, other work on the machine only ever adds time: the fastest round is the one it
    spared)."""
    runs = {label: [] for label in steps}
    for _ in range(rounds):
        for label, step in steps.items():
            runs[label].append(step())
    return {label: min(found, key=lambda r: r.bubble.window_s) for label, found in runs.items()}


@dataclass(frozen=True)
class BubbleCheck:
    """GPipe training steps with every forward and backward padded to ``op_s``, on pools of 2 and 4 ranks
    (``curves``, one ``BubbleCurve`` per pool), and one ``Verdict`` per point: the idle fraction measured
    against ``(p - 1) / (m + p - 1)``. ``where``: the machines, in words."""

    op_s: float
    curves: tuple[BubbleCurve, ...]
    verdicts: tuple[Verdict, ...]
    where: str

    def measured(self) -> dict[int, dict[int, float]]:
        """``{p: {m: idle fraction measured}}``, as ``bubble_curve_figure`` takes it."""
        return {c.n_stages: {pt.n_microbatches: pt.measured for pt in c.points} for c in self.curves}


def run_bubble_check(ranks, microbatches, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor, op_s: float = 0.03, name: str = "gpipe") -> BubbleCheck:
    """The idle fraction of schedule ``name`` on ``ranks`` (a pool, or several: one curve each, one stage per
    rank) for each ``m`` in ``microbatches``, each op padded to ``op_s``. A point outside ``BUBBLE_BAND`` of the
    formula is measured again (``verified``, at most 3 times); the least idle attempt is kept, since a stall on
    a shared machine only ever adds idle time."""
    pools = tuple(ranks) if isinstance(ranks, (list, tuple)) else (ranks,)
    curves, verdicts = [], []
    for pool in pools:  # every pool up and warm before any is timed: a pool still starting takes the cores
        _warm(pool, model, layers, x, grad_output)
    for pool in pools:
        p = pool.world_size
        points = []
        for m in microbatches:
            schedule = make_schedule(name, p, m)
            predicted = pipeline_bubble_fraction(p, m)
            attempts: list[float] = []

            def measure(schedule=schedule, attempts=attempts, pool=pool) -> float:
                run = run_pipeline(pool, schedule, model, layers, x, grad_output, op_s, op_s)
                attempts.append(run.bubble.idle_fraction)
                return min(attempts)

            _, found = verified(measure, lambda idle, p=p, m=m, predicted=predicted: [
                Verdict(f"idle share, p = {p}, m = {m:<2}", predicted, idle, "%", *BUBBLE_BAND)])
            verdicts += found
            points.append(BubblePoint(p, m, predicted, tuple(attempts)))
        curves.append(BubbleCurve(name, p, op_s, tuple(points)))
    where = "; ".join(dict.fromkeys(pool.description for pool in pools))
    return BubbleCheck(op_s, tuple(curves), tuple(verdicts), where)


@dataclass(frozen=True)
class PaceCheck:
    """Forward-only GPipe on a pool, every stage's forward padded to ``forward_s[label]`` (``"uniform"``, and
    one stage ``slow_stage`` twice as slow), the fastest of a few rounds each (``runs``); the verdicts: each
    step against ``predicted_step_s``, their ratio, and the share of the step the slow stage computes."""

    schedule: Schedule
    slow_stage: int
    forward_s: dict
    runs: dict
    verdicts: tuple[Verdict, ...]

    def predicted_s(self, label: str) -> float:
        return float(predicted_step_s(self.schedule, self.forward_s[label], 0))

    def busy_shares(self, label: str) -> tuple[float, ...]:
        """Per stage, the share of the measured step it spent computing."""
        bubble = self.runs[label].bubble
        return tuple(b / bubble.window_s for b in bubble.busy_s)

    def predicted_shares(self, label: str) -> tuple[float, ...]:
        return tuple(self.schedule.n_microbatches * d / self.predicted_s(label) for d in self.forward_s[label])


def run_pace_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int = 6,
                   op_s: float = 0.015, slow_stage: int = 1, rounds: int = 3) -> PaceCheck:
    """A forward-only step with uniform stages (``op_s`` each) against the same step with stage
    ``slow_stage`` at ``2 op_s``: the slow step follows the schedule's prediction and the slow stage computes
    for most of it while the others wait. Measured again while a verdict fails (``verified``)."""
    p = ranks.world_size
    if not 0 <= slow_stage < p:
        raise ValueError(f"slow_stage is a stage of the pool's {p}: 0 .. {p - 1}, got {slow_stage}")
    schedule = make_schedule("gpipe", p, n_microbatches, training=False)
    forward_s = {"uniform": (op_s,) * p,
                 f"stage {slow_stage} slow": tuple(2 * op_s if s == slow_stage else op_s for s in range(p))}
    _warm(ranks, model, layers, x, None)

    def measure() -> PaceCheck:
        runs = _fastest({k: (lambda d=d: run_pipeline(ranks, schedule, model, layers, x, forward_s=list(d)))
                         for k, d in forward_s.items()}, rounds)
        return PaceCheck(schedule, slow_stage, forward_s, runs, ())

    def verdicts(c: PaceCheck) -> list[Verdict]:
        even, slow = forward_s
        steps = {k: c.runs[k].bubble.window_s for k in forward_s}
        return [Verdict(f"step, {k}", c.predicted_s(k), steps[k], "s", *STEP_BAND) for k in forward_s] + [
            Verdict("slow step / uniform step", c.predicted_s(slow) / c.predicted_s(even), steps[slow] / steps[even],
                    "", *RATIO_BAND),
            Verdict(f"stage {slow_stage}'s share of the slow step", c.predicted_shares(slow)[slow_stage],
                    c.busy_shares(slow)[slow_stage], "%", *RATIO_BAND)]

    check, found = verified(measure, verdicts)
    return PaceCheck(schedule, slow_stage, forward_s, check.runs, found)


@dataclass(frozen=True)
class UnevenCheck:
    """Stages of unequal layer counts on a pool: ``exact``, a training step (1F1B) with ``counts["lighter
    ends"]`` against the one-process model; and forward-only steps of the cuts in ``counts``, each stage's
    forward padded to ``layer_s`` per layer-time of work (its layers, plus one on the end stages for the
    embedding and the loss), the fastest of a few rounds each (``runs``), with their verdicts."""

    counts: dict
    work: dict
    layer_s: float
    n_microbatches: int
    exact: PipelineRun
    runs: dict
    verdicts: tuple[Verdict, ...]

    def predicted_s(self, label: str) -> float:
        return pipeline_step_s([w * self.layer_s for w in self.work[label]], self.n_microbatches)


def run_uneven_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, grad_output: torch.Tensor,
                     counts: dict, n_microbatches: int = 6, layer_s: float = 0.008, rounds: int = 3) -> UnevenCheck:
    """Each cut of ``counts`` (a label and layers per stage) run forward-only at its slowest stage's pace,
    predicted by ``pipeline_step_s``; and the first cut's last one, ``counts``' last value, exact in training."""
    p = ranks.world_size
    work = {k: tuple(c + (1 if s in (0, p - 1) else 0) for s, c in enumerate(v)) for k, v in counts.items()}
    last = list(counts)[-1]
    exact = run_pipeline(ranks, make_schedule("1f1b", p, 2 * p), model, layers, x, grad_output,
                         layer_counts=list(counts[last]))
    schedule = make_schedule("gpipe", p, n_microbatches, training=False)

    def measure() -> dict:
        return _fastest({k: (lambda k=k: run_pipeline(ranks, schedule, model, layers, x,
                                                      forward_s=[w * layer_s for w in work[k]],
                                                      layer_counts=list(counts[k]))) for k in counts}, rounds)

    def predicted(k: str) -> float:
        return pipeline_step_s([w * layer_s for w in work[k]], n_microbatches)

    def verdicts(runs: dict) -> list[Verdict]:
        first, second = list(counts)[:2]
        steps = {k: runs[k].bubble.window_s for k in counts}
        return [Verdict(f"step, {k}", predicted(k), steps[k], "s", *STEP_BAND) for k in counts] + [
            Verdict(f"{first} / {second}", predicted(first) / predicted(second), steps[first] / steps[second],
                    "", *RATIO_BAND)]

    runs, found = verified(measure, verdicts)
    return UnevenCheck(dict(counts), work, layer_s, n_microbatches, exact, runs, found)


@dataclass(frozen=True)
class TripCheck:
    """A forward-only pass of ``n_microbatches`` through uniform stages of ``op_s`` (the fastest of a few
    rounds): ``trips``, each microbatch's time from entering stage 0 to leaving the last stage, and the gaps
    between departures, with their verdicts (a trip is ``p op_s``, a departure every ``op_s``)."""

    n_stages: int
    op_s: float
    trips: Trips
    verdicts: tuple[Verdict, ...]


def run_trip_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int | None = None,
                   op_s: float = 0.015, rounds: int = 3) -> TripCheck:
    """Pipelined decode's two numbers on a pool, measured: a microbatch's trip through every stage (the
    pipeline does not shorten it) and the time between microbatches leaving (one stage-time)."""
    p = ranks.world_size
    m = p if n_microbatches is None else n_microbatches
    schedule = make_schedule("gpipe", p, m, training=False)
    _warm(ranks, model, layers, x, None)

    def measure() -> Trips:
        run = _fastest({"uniform": lambda: run_pipeline(ranks, schedule, model, layers, x, forward_s=op_s)}, rounds)
        return microbatch_trips(run["uniform"].spans, p)

    def verdicts(t: Trips) -> list[Verdict]:
        return [Verdict("a microbatch's trip (median)", p * op_s, statistics.median(t.trip_s), "s", *STEP_BAND),
                Verdict("time between departures (median)", op_s, statistics.median(t.gap_s), "s", 0.9, 1.3)]

    trips, found = verified(measure, verdicts)
    return TripCheck(p, op_s, trips, found)
