"""The pipeline claims notebook 03 prints, one ``lab.verdict.Verdict`` per claim, measured again while one
fails (``verified``).

* ``run_bubble_check``: the idle fraction of steps (forward-only passes without ``grad_output``, training
  steps with it) against ``(p - 1) / (m + p - 1)``.
* ``run_pace_check`` (a slow stage sets the pace), ``run_uneven_check`` (unequal stages, exact, each cut at
  its slowest stage's pace) and ``run_trip_check`` (a microbatch's trip through every stage, one departure
  per stage-time): forward-only GPipe steps, the fastest of a few repeats kept, read as a ``StepCheck``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field, replace

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.schedules import Schedule
from shardlib.lab.pipeline.step import PipelineRun, run_pipeline
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.pipeline import Trips, microbatch_trips, pipeline_bubble_fraction, predicted_step_s

BUBBLE_BAND = (0.9, 1.6)  # messages only add idle time, and at m = 16 the bubble itself is a few percent
STEP_BAND = (0.95, 1.3)  # a padded step: hops and bookkeeping only add time
RATIO_BAND = (0.85, 1.15)  # two steps of one run against each other: the hops mostly cancel


def _warm(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, grad_output) -> None:
    """One short step on fresh ranks: the first backward on a new process is slow (imports, first messages)."""
    run_pipeline(ranks, make_schedule("gpipe", ranks.world_size, 1, training=grad_output is not None), model,
                 layers, x, grad_output, forward_s=0.001, backward_s=0.001 if grad_output is not None else None)


@dataclass(frozen=True)
class BubbleCheck:
    """Steps (forward-only, or training) with every op padded to ``op_s``: ``attempts[(p, m)]``, every idle
    fraction measured at that point, and one ``Verdict`` per point. ``where``: the machines, in words."""

    op_s: float
    attempts: dict
    verdicts: tuple[Verdict, ...]
    where: str

    def measured(self) -> dict[int, dict[int, float]]:
        """``{p: {m: the least idle attempt}}``, as ``bubble_curve_figure`` takes it (a stall on a shared
        machine only ever adds idle time, so the least idle attempt is the least disturbed one)."""
        out: dict = {}
        for (p, m), found in self.attempts.items():
            out.setdefault(p, {})[m] = min(found)
        return out


def run_bubble_check(ranks, microbatches, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor | None, op_s: float = 0.03, name: str = "gpipe") -> BubbleCheck:
    """The idle fraction of schedule ``name`` on ``ranks`` (a pool, or several: one stage per rank) for each
    ``m`` in ``microbatches``, each op padded to ``op_s``: training steps with ``grad_output``, forward-only
    passes (a server's) without it; the formula is the same for both. A point outside ``BUBBLE_BAND`` of the formula is
    measured again (``verified``, at most 3 times); the least idle attempt is the one judged."""
    pools = tuple(ranks) if isinstance(ranks, (list, tuple)) else (ranks,)
    for pool in pools:  # every pool up and warm before any is timed: a pool still starting takes the cores
        _warm(pool, model, layers, x, grad_output)
    attempts: dict = {}
    verdicts: list[Verdict] = []
    for pool in pools:
        p = pool.world_size
        for m in microbatches:
            training = grad_output is not None
            schedule, predicted = make_schedule(name, p, m, training), pipeline_bubble_fraction(p, m)
            found = attempts[(p, m)] = []

            def measure(pool=pool, schedule=schedule, found=found) -> float:
                run = run_pipeline(pool, schedule, model, layers, x, grad_output, op_s, op_s if training else None)
                found.append(run.bubble.idle_fraction)
                return min(found)

            verdicts += verified(measure, lambda idle, p=p, m=m, predicted=predicted: [
                Verdict(f"idle share, p = {p}, m = {m:<2}", predicted, idle, "%", *BUBBLE_BAND)])[1]
    where = "; ".join(dict.fromkeys(pool.description for pool in pools))
    return BubbleCheck(op_s, {k: tuple(v) for k, v in attempts.items()}, tuple(verdicts), where)


@dataclass(frozen=True)
class StepCheck:
    """Forward-only steps of ``schedule``, one per label: each stage's forward padded to
    ``forward_s[label]`` (one time per stage), the fastest of a few repeats kept (``runs``), and the
    ``verdicts``. For unequal cuts, ``work`` (layer-times per stage) and ``exact``, a step with the last cut
    (training, or forward only), to check against the one-process model."""

    schedule: Schedule
    forward_s: dict
    runs: dict
    verdicts: tuple[Verdict, ...] = ()
    work: dict = field(default_factory=dict)
    exact: PipelineRun | None = None

    def predicted_s(self, label: str) -> float:  # the schedule's step: sum(t) + (m - 1) max(t)
        return float(predicted_step_s(self.schedule, list(self.forward_s[label]), 0))

    def measured_s(self, label: str) -> float:
        return self.runs[label].bubble.window_s

    def busy_shares(self, label: str) -> tuple[float, ...]:  # per stage, the share of the step it computed
        bubble = self.runs[label].bubble
        return tuple(b / bubble.window_s for b in bubble.busy_s)

    def predicted_shares(self, label: str) -> tuple[float, ...]:
        return tuple(self.schedule.n_microbatches * d / self.predicted_s(label) for d in self.forward_s[label])

    @property
    def trips(self) -> Trips:  # each microbatch's trip through the first label's step, and the departures
        return microbatch_trips(next(iter(self.runs.values())).spans, self.schedule.n_stages)

    def step_verdicts(self) -> list[Verdict]:
        return [Verdict(f"step, {k}", self.predicted_s(k), self.measured_s(k), "s", *STEP_BAND) for k in self.forward_s]

    def ratio_verdict(self, what: str, top: str, bottom: str) -> Verdict:
        return Verdict(what, self.predicted_s(top) / self.predicted_s(bottom),
                       self.measured_s(top) / self.measured_s(bottom), "", *RATIO_BAND)


def _step_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int,
                forward_s: dict, rounds: int, verdicts, counts: dict | None = None, **extra) -> StepCheck:
    """Each label's forward-only GPipe step, ``rounds`` repeats, the fastest kept (with every op padded,
    other work on the machine only ever adds time), measured again while a verdict fails."""
    schedule = make_schedule("gpipe", ranks.world_size, n_microbatches, training=False)
    counts = counts or {}
    _warm(ranks, model, layers, x, None)

    def measure() -> StepCheck:
        runs = {k: run_pipeline(ranks, schedule, model, layers, x, forward_s=list(d), repeats=rounds,
                                layer_counts=list(counts[k]) if k in counts else None).fastest()
                for k, d in forward_s.items()}
        return StepCheck(schedule, forward_s, runs, **extra)

    check, found = verified(measure, verdicts)
    return replace(check, verdicts=found)


def run_pace_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int = 6,
                   op_s: float = 0.015, slow_stage: int = 1, rounds: int = 3) -> StepCheck:
    """A forward-only step with uniform stages (``op_s`` each) against the same step with stage
    ``slow_stage`` at ``2 op_s``: the slow step follows the schedule's prediction and the slow stage computes
    for most of it while the others wait."""
    p = ranks.world_size
    if not 0 <= slow_stage < p:
        raise ValueError(f"slow_stage is a stage of the pool's {p}: 0 .. {p - 1}, got {slow_stage}")
    slow = f"stage {slow_stage} slow"
    forward_s = {"uniform": (op_s,) * p, slow: tuple(2 * op_s if s == slow_stage else op_s for s in range(p))}

    def verdicts(c: StepCheck) -> list[Verdict]:
        return c.step_verdicts() + [
            c.ratio_verdict("slow step / uniform step", slow, "uniform"),
            Verdict(f"stage {slow_stage}'s share of the slow step", c.predicted_shares(slow)[slow_stage],
                    c.busy_shares(slow)[slow_stage], "%", *RATIO_BAND)]

    return _step_check(ranks, model, layers, x, n_microbatches, forward_s, rounds, verdicts)


def run_uneven_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor | None, counts: dict, n_microbatches: int = 6, layer_s: float = 0.008,
                     rounds: int = 3) -> StepCheck:
    """Each cut of ``counts`` (a label and layers per stage) run forward-only, each stage's forward padded to
    ``layer_s`` per layer-time of work (its layers, plus one on the end stages for the embedding and the
    loss), at its slowest stage's pace; and the last cut exact, in a training step (1F1B) with
    ``grad_output``, in a forward-only pass without it."""
    p = ranks.world_size
    work = {k: tuple(c + (1 if s in (0, p - 1) else 0) for s, c in enumerate(v)) for k, v in counts.items()}
    kind = "1f1b" if grad_output is not None else "gpipe"  # forward only, every schedule is the same list
    exact = run_pipeline(ranks, make_schedule(kind, p, 2 * p, grad_output is not None), model, layers, x, grad_output,
                         layer_counts=list(counts[list(counts)[-1]]))
    first, second = list(counts)[:2]
    return _step_check(ranks, model, layers, x, n_microbatches,
                       {k: tuple(w * layer_s for w in work[k]) for k in counts}, rounds,
                       lambda c: c.step_verdicts() + [c.ratio_verdict(f"{first} / {second}", first, second)],
                       counts, work=work, exact=exact)


def run_trip_check(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int | None = None,
                   op_s: float = 0.015, rounds: int = 3) -> StepCheck:
    """Pipelined decode's two numbers on a pool, measured: a microbatch's trip through every stage (the
    pipeline does not shorten it) and the time between microbatches leaving (one stage-time)."""
    p = ranks.world_size

    def verdicts(c: StepCheck) -> list[Verdict]:
        t = c.trips
        return [Verdict("a microbatch's trip (median)", p * op_s, statistics.median(t.trip_s), "s", *STEP_BAND),
                Verdict("time between departures (median)", op_s, statistics.median(t.gap_s), "s", 0.9, 1.3)]

    return _step_check(ranks, model, layers, x, p if n_microbatches is None else n_microbatches,
                       {"uniform": (op_s,) * p}, rounds, verdicts)
