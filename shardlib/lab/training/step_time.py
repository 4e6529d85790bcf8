"""Step time per layout: the training planner's time model on this machine's ranks, beside the measured step.

The toy cluster is fitted here (``fit_step_cluster``: a sweep's link, at least a call between computing
ranks, and the model's forward, backward and AdamW step timed on every rank at once); every layout trains
on one warm pool at one global batch, in rounds, the median step after a warm-up read from the spans
(``run_step_time_check``), beside ``toy_prediction.predict_step``. The ranking claim: Spearman's correlation
of predicted and measured step times against the floor a random order reaches with a small chance.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import torch

from shardlib.core.adamw import adamw
from shardlib.core.checks import whole_number
from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig, init_weights
from shardlib.core.training.corpus import MarkovCorpus
from shardlib.core.training.reference import forward
from shardlib.facts.hardware import Cluster, Link, toy_cluster
from shardlib.lab.costs.calibration import run_calibration
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.drivers import TOY_SWEEP_BYTES
from shardlib.lab.training.drivers import check_training, run_training
from shardlib.lab.verdict import Verdict, refitted, verified
from shardlib.predict.alpha_beta import Calibration
from shardlib.predict.training.time_model import TrainingScore, model_flops_per_token
from shardlib.predict.training.toy_prediction import (
    LAYOUTS_4,
    RANKED_4,
    STEP_TIME_CONFIG,
    chance_of_correlation,
    floor_for_chance,
    predict_step,
    spearman,
    step_config,
    toy_config_settings,
)


def pass_on_rank(ctx, config: TrainingConfig) -> None:
    """The whole model's forward and backward on one microbatch (the reference's code), then AdamW's step:
    the spans ``"forward-backward"`` and ``"optimizer"``."""
    weights = {k: v.clone().requires_grad_(True) for k, v in init_weights(config).items()}
    tokens, optimizer = MarkovCorpus(config).batch(0, config.microbatch), adamw(list(weights.values()), config)
    with ctx.timeline.span("forward-backward"):
        forward(weights, tokens, config).token_losses.mean().backward()
    with ctx.timeline.span("optimizer"):
        optimizer.step()


def calls_on_rank(ctx, config: TrainingConfig, group: str, calls: int = 20) -> None:
    """``calls`` times a block's matmuls, each followed (``group``: ``"all"``, ``"pairs"``; not ``"none"``)
    by an all-gather of a sequence-parallel slice over every rank or over tp pairs."""
    x, w = torch.randn(config.microbatch * config.seq, config.d_model), torch.randn(config.d_model, config.d_ff)
    piece = torch.randn(max(1, config.microbatch * config.seq // ctx.world_size), config.d_model)
    lay = Layout(2, 1, ctx.world_size // 2)  # its tp pairs: a mesh a dp2 x tp2 run makes (and keeps) anyway
    pg = ctx.device_mesh(lay.mesh_shape, lay.mesh_axes).get_group("tp") if group == "pairs" else None
    for _ in range(calls):
        for _ in range(4):
            x @ w
        if group != "none":
            ctx.comm.all_gather(piece, group=pg)


def sample(ranks, config: TrainingConfig, repeats: int = 3, calls: int = 20) -> list[tuple[float, ...]]:
    """Per rank: the median seconds of ``pass_on_rank``'s two spans over ``repeats`` (after a warm-up), then
    the seconds per call of ``calls_on_rank`` alone, over every rank and over pairs (its second run)."""
    passes = on_ranks(ranks, pass_on_rank, config, repeats=repeats + 1)
    per_call = [on_ranks(ranks, calls_on_rank, config, group, calls, repeats=2) for group in ("none", "all", "pairs")]

    def median_s(name: str, rank: int) -> float:
        return statistics.median(s.duration_s for i in range(1, repeats + 1) for s in passes.spans(name, rank, i))

    return [(median_s("forward-backward", r), median_s("optimizer", r),
             *(got.elapsed_s(r)[-1] / calls for got in per_call)) for r in range(ranks.world_size)]


@dataclass(frozen=True)
class StepCluster:
    """The toy cluster the prediction runs on, and what it was fitted from: the sweep's link, the extra
    time of one collective between ranks that compute (``busy_calls_s``), the median rank's forward and
    backward of one microbatch and AdamW step, every rank at once."""

    cluster: Cluster
    calibration: Calibration
    busy_calls_s: tuple  # (ranks, seconds a call adds between computing ranks), over pairs and over all
    microbatch_s: float
    optimizer_s: float
    samples: int = 1


def calibrate_link(ranks, attempts: int = 3) -> Calibration:
    """A short sweep's fit (median rounds), taken again if a busy machine leaves no bandwidth to fit."""
    return refitted(lambda _: run_calibration(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2,
                                              statistic="median"), attempts)


def step_cluster(cal: Calibration, samples, config: TrainingConfig) -> StepCluster:
    """The toy cluster from a sweep and ``sample``'s samples (each: every rank's tuple), medians over
    samples: its latency per ring step at least what a call over a pair of computing ranks adds."""
    world = len(samples[0])
    pass_s = statistics.median(statistics.median(r[0] for r in one) for one in samples)
    step_s = statistics.median(statistics.median(r[1] for r in one) for one in samples)
    calls = {n: statistics.median(max(1e-9, max(r[i] for r in one) - max(r[2] for r in one)) for one in samples)
             for n, i in ((world, 3), (2, 4))}  # what a call adds over every rank and over pairs
    fitted = cal.link  # a pair's call is one ring step: the groups of 4-rank layouts are pairs but for tp4, dp4
    link = Link(f"{fitted.name}, ranks computing", fitted.bandwidth_bytes_per_s, max(fitted.latency_s, calls[2]),
                source=fitted.source, latency_source="the larger of the sweep's fit and a call between computing pairs")
    flops = model_flops_per_token(config.model, config.seq) * config.microbatch * config.seq
    per_param = toy_config_settings(config)["optimizer_bytes_per_param"]
    moved = sum(v.numel() for v in init_weights(config).values()) * per_param
    cluster = replace(toy_cluster(link, flops_per_s=flops / pass_s, nodes=1, ranks_per_node=world),
                      memory_bytes_per_s=moved / step_s)  # AdamW's bytes over its measured step
    return StepCluster(cluster, cal, tuple(sorted(calls.items())), pass_s, step_s, len(samples))


def fit_step_cluster(ranks, config: TrainingConfig = STEP_TIME_CONFIG, samples: int = 3, **options) -> StepCluster:
    """The toy cluster for ``ranks``: ``calibrate_link``, then ``samples`` rounds of ``sample`` (``options``)."""
    cal = calibrate_link(ranks)
    return step_cluster(cal, [sample(ranks, config, **options) for _ in range(samples)], config)


@dataclass(frozen=True)
class LayoutTime:
    """One layout's step: predicted (``score``, term by term) and measured (every step after the warm-up)."""

    label: str
    score: TrainingScore  # its layout's
    steps_s: tuple[float, ...]

    @property
    def predicted_s(self) -> float:
        return self.score.step_s

    @property
    def measured_s(self) -> float:
        return statistics.median(self.steps_s)

    @property
    def ratio(self) -> float:
        """Measured over predicted."""
        return self.measured_s / self.predicted_s

    @property
    def error(self) -> float:
        """``|measured - predicted| / measured``: the relative error simulators publish."""
        return abs(self.measured_s - self.predicted_s) / self.measured_s


@dataclass(frozen=True)
class StepTimeCheck:
    """Every layout's step, predicted and measured, on one pool at one global batch, and how well the
    prediction ranks them."""

    fit: StepCluster
    config: TrainingConfig
    global_sequences: int
    layouts: tuple[LayoutTime, ...]

    @property
    def mean_error(self) -> float:
        return statistics.mean(t.error for t in self.layouts)

    @property
    def by_predicted(self) -> tuple[str, ...]:
        return tuple(t.label for t in sorted(self.layouts, key=lambda t: t.predicted_s))

    @property
    def by_measured(self) -> tuple[str, ...]:
        return tuple(t.label for t in sorted(self.layouts, key=lambda t: t.measured_s))

    def only(self, labels) -> StepTimeCheck:
        """The same check, over the layouts named in ``labels`` only."""
        return replace(self, layouts=tuple(t for t in self.layouts if t.label in labels))

    @property
    def rank_correlation(self) -> float:
        return spearman([t.predicted_s for t in self.layouts], [t.measured_s for t in self.layouts])


def run_step_time_check(ranks, config: TrainingConfig = STEP_TIME_CONFIG, layouts: dict | None = None,
                        global_sequences: int = 4, warmup: int = 1, rounds: int = 1,
                        fit: StepCluster | None = None) -> StepTimeCheck:
    """Predict and measure one training step of every layout in ``layouts`` (label -> ``Layout``; the
    issue's 4-rank ones by default) on ``ranks``, all at ``global_sequences`` sequences per step.
    ``config.steps`` steps a run, the first ``warmup`` left out; ``rounds`` runs of every layout, the order
    reversed every other round, so that a burst of other work spoils a few steps of every layout rather
    than every step of one: the median over all. Every layout is checked before any rank starts. Unless
    ``fit`` (a ``StepCluster``) is given, it is fitted here, a sample taken before each run, so that the
    machine's load while the layouts ran is the fit's."""
    layouts = dict(LAYOUTS_4 if layouts is None else layouts)
    whole_number(warmup, "warmup (steps left out of the median)", 0)
    whole_number(rounds, "rounds (runs of every layout)")
    if config.steps <= warmup:
        raise ValueError(f"{config.steps} steps leave none to time after {warmup} warm-up step(s): give "
                         f"config.steps > warmup")
    configs = {}
    for label, layout in layouts.items():
        if layout.world_size != ranks.world_size:
            raise ValueError(f"{label} needs {layout.world_size} ranks; the pool has {ranks.world_size}")
        configs[label] = step_config(config, layout, global_sequences)
        check_training(layout, configs[label])
    cal, samples, measured = None if fit else calibrate_link(ranks), [], {label: () for label in layouts}
    for r in range(rounds):
        for label, layout in list(layouts.items())[::1 - 2 * (r % 2)]:
            if fit is None:
                samples.append(sample(ranks, config))
            measured[label] += run_training(ranks, layout, configs[label]).steps_s[warmup:]
    fit = fit or step_cluster(cal, samples, config)
    out = tuple(LayoutTime(label, predict_step(fit.cluster, layout, config, global_sequences), measured[label])
                for label, layout in layouts.items())
    return StepTimeCheck(fit, config, global_sequences, out)


def ranking_verdict(check: StepTimeCheck, floor: float) -> Verdict:
    """Spearman's correlation of ``check``'s predicted and measured step times, claimed at least ``floor``
    (a perfect order, 1, shown for scale)."""
    n = len(check.layouts)
    fastest = ("the same layout fastest both ways" if check.by_predicted[0] == check.by_measured[0] else
               f"fastest predicted {check.by_predicted[0]}, measured {check.by_measured[0]}")
    return Verdict.one_sided(f"ranking {n} layouts by step time, Spearman's correlation of predicted and measured "
                             f"(a random order reaches {floor:.2f} {chance_of_correlation(floor, n):.1%} of the "
                             f"time; {fastest})", 1.0, check.rank_correlation, "", at_least=floor)


def run_ranking_check(ranks, attempts: int = 2, chance: float = 0.05, **kwargs) -> tuple[StepTimeCheck, tuple]:
    """``(check, (its ranking_verdict,))``: ``run_step_time_check(ranks, **kwargs)`` (``RANKED_4``'s seven
    layouts unless ``layouts`` is given), measured again while Spearman's correlation stays under the floor
    a random order reaches with probability ``chance`` (``floor_for_chance``); strict, one never held raises."""
    if not 0 < chance < 1:
        raise ValueError(f"chance is a probability between 0 and 1, got {chance}")
    kwargs.setdefault("layouts", RANKED_4)
    floor = floor_for_chance(len(kwargs["layouts"]), chance)
    return verified(lambda: run_step_time_check(ranks, **kwargs), lambda c: [ranking_verdict(c, floor)], attempts)
