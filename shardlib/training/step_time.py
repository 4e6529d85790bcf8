"""Step time per layout: the training planner's time model on this machine's ranks, beside the measured step.

* ``fit_step_cluster``: the toy cluster the prediction runs on: a link fitted on the ranks (median rounds;
  its latency at least what a call between computing ranks adds, ``busy_call_on_rank``), the model's
  forward and backward and AdamW's step timed on every rank at once (``rate_on_rank``): shared cores counted.
* ``predict_step``: ``plan.training.score_training`` for one layout, term by term, at one global batch.
* ``run_step_time_check``: every layout trained on one warm pool (``drivers.run_training``, each at the
  same global batch), the median step after a warm-up read from the spans, beside its prediction, as a
  ``StepTimeCheck``: errors per layout, their mean, the ranking both ways and Spearman's correlation.
* ``spearman``: the rank correlation (average ranks for ties). Pure, like ``step_config``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch

from ..checks import whole_number
from ..combined.drivers import TOY_SWEEP_BYTES
from ..costs.calibration import Calibration
from ..costs.drivers import run_calibration
from ..hardware import Cluster, Link, toy_cluster
from ..plan.layout import Layout
from ..plan.training import TrainingScore, TrainingWorkload, model_flops_per_token, score_training
from .corpus import MarkovCorpus, TrainingConfig
from .drivers import check_training, run_training
from .reference import adamw, init_weights, token_losses

# The 4-rank layouts, and three single-axis ones beside them.
LAYOUTS_4 = {
    "dp2 x tp2": Layout(tp=2, pp=1, dp=2),
    "pp2 x tp2": Layout(tp=2, pp=2),
    "dp2 x pp2": Layout(tp=1, pp=2, dp=2),
    "cp2 x tp2": Layout(tp=2, pp=1, cp=2),
    "dp2 x tp2 zero3": Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"),
}
SINGLE_AXIS_4 = {"dp4": Layout(tp=1, pp=1, dp=4), "tp4": Layout(tp=4, pp=1), "pp4": Layout(tp=1, pp=4)}
# Small enough for a notebook cell, wide enough that a block's matmuls are more than Python's overhead.
STEP_TIME_CONFIG = TrainingConfig(n_layers=4, d_model=128, n_heads=4, n_kv_heads=4, d_ff=512, vocab_size=256,
                                  seq=64, microbatch=1, m=4, steps=4)


def spearman(xs, ys) -> float:
    """Spearman's rank correlation of two equally long sequences: Pearson's correlation of their ranks,
    tied values sharing the average of the ranks they span. 1: same order; -1: reversed."""
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"the rank correlation needs two sequences of the same length, at least 2; got {len(xs)} "
                         f"and {len(ys)} values")
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        raise ValueError("the rank correlation is undefined when every value of one sequence is the same")
    return cov / (vx * vy) ** 0.5


def average_ranks(values) -> list[float]:
    """Each value's rank, 1 for the smallest; tied values get the mean of the ranks they occupy."""
    values = list(values)  # those below it, then the middle of the places its ties share
    return [sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2 for x in values]


def step_config(config: TrainingConfig, layout: Layout, global_sequences: int) -> TrainingConfig:
    """``config`` with ``m`` set so that every layout trains on the same global batch of
    ``global_sequences`` sequences: ``m = global_sequences / (microbatch x dp)``."""
    whole_number(global_sequences, "global_sequences (sequences per step)")
    per = config.microbatch * layout.dp
    if global_sequences % per:
        raise ValueError(f"a global batch of {global_sequences} sequences does not split into microbatches of "
                         f"{config.microbatch} over dp = {layout.dp} replicas ({global_sequences} % {per} != 0)")
    return replace(config, m=global_sequences // per)


def step_workload(config: TrainingConfig, global_sequences: int) -> TrainingWorkload:
    """The planner's workload for the toy: its sequence, the global batch, no recomputation, the toy's
    microbatch, kernels at the measured rate (efficiency 1), values on the wire in the toy's dtype, and
    AdamW's pass counted (a toy step has a few hundred tokens: its optimizer step is not negligible)."""
    return TrainingWorkload(sequence_tokens=config.seq, global_batch_tokens=global_sequences * config.seq,
                            recompute=("none",), microbatch_sizes=(config.microbatch,), kernel_efficiency=1.0,
                            min_ring_slice_tokens=1, comm_bytes_per_value=config.element_bytes,
                            optimizer_bytes_per_param=optimizer_bytes_per_param(config))


def predict_step(cluster: Cluster, layout: Layout, config: TrainingConfig, global_sequences: int) -> TrainingScore:
    """The training planner's step (``score_training``) for ``layout`` on ``cluster``, term by term."""
    return score_training(config.model, cluster, layout, step_workload(config, global_sequences), config.microbatch,
                          "none")


def rate_on_rank(ctx, config: TrainingConfig, repeats: int = 5) -> tuple[float, float]:
    """This rank's median seconds for the whole model's forward and backward on one microbatch (one
    process, the reference's code) and for AdamW's step over every weight, after a warm-up."""
    weights = {k: v.clone().requires_grad_(True) for k, v in init_weights(config).items()}
    tokens, optimizer = MarkovCorpus(config).batch(0, config.microbatch), adamw(list(weights.values()), config)
    passes, steps = [], []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        token_losses(weights, tokens, config).mean().backward()
        middle = time.perf_counter()
        optimizer.step()
        passes.append(middle - start)
        steps.append(time.perf_counter() - middle)
    return statistics.median(passes[1:]), statistics.median(steps[1:])


def busy_call_on_rank(ctx, config: TrainingConfig, calls: int = 30) -> dict:
    """Per call, on every rank at once: a block's matmuls alone, then the same followed by an all-gather
    of a sequence-parallel slice over every rank (the fastest of two rounds of ``calls`` each)."""
    x, w = torch.randn(config.microbatch * config.seq, config.d_model), torch.randn(config.d_model, config.d_ff)
    piece = torch.randn(max(1, config.microbatch * config.seq // ctx.world_size), config.d_model)
    out = {"compute": [], "both": []}
    for mode in ("compute", "both") * 2:
        ctx.comm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            for _ in range(4):
                x @ w
            if mode == "both":
                ctx.comm.all_gather(piece)
        out[mode].append((time.perf_counter() - start) / calls)
    return {k: min(v) for k, v in out.items()}


def optimizer_bytes_per_param(config: TrainingConfig) -> int:
    """What AdamW moves per parameter: reads the weight, its gradient and two moments, writes three."""
    return 7 * config.element_bytes


@dataclass(frozen=True)
class StepCluster:
    """The toy cluster the prediction runs on, and what it was fitted from: the sweep's link, the extra
    time of one collective between ranks that compute (``busy_call_s``), the median rank's forward and
    backward of one microbatch and AdamW step, every rank at once."""

    cluster: Cluster
    calibration: Calibration
    busy_call_s: float
    microbatch_s: float
    optimizer_s: float

    def text(self) -> str:
        link = self.cluster.intra_link
        return (f"link: latency {link.latency_s * 1e3:.3f} ms per ring step (sweep's fit "
                f"{self.calibration.link.latency_s * 1e3:.3f} ms; a call between computing ranks "
                f"{self.busy_call_s * 1e3:.2f} ms over the {self.calibration.samples[0].n_ranks} ranks), bandwidth "
                f"{link.bandwidth_bytes_per_s / 1e9:.2f} GB/s; compute {self.cluster.peak_flops_per_s / 1e9:.2f} "
                f"GFLOP/s per rank (a microbatch's forward and backward in {self.microbatch_s * 1e3:.1f} ms); AdamW "
                f"at {self.cluster.memory_bytes_per_s / 1e9:.2f} GB/s ({self.optimizer_s * 1e3:.1f} ms a step); "
                "every rank at once")


def fit_step_cluster(ranks, config: TrainingConfig = STEP_TIME_CONFIG, attempts: int = 3) -> StepCluster:
    """The toy cluster for ``ranks``: a link fitted to a short sweep (median rounds; repeated up to
    ``attempts`` times if a busy machine leaves no bandwidth to fit) whose latency per ring step is at
    least what a call between computing ranks adds (``busy_call_on_rank``), a compute rate and a memory
    rate from ``rate_on_rank``."""
    for attempt in range(attempts):
        try:
            cal = run_calibration(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2, statistic="median")
            break
        except ValueError:
            if attempt == attempts - 1:
                raise
    busy = ranks.run(busy_call_on_rank, config)
    call_s = max(0.0, max(b["both"] for b in busy) - max(b["compute"] for b in busy))
    per_step_s = call_s / max(1, ranks.world_size - 1)  # an all-gather's ring steps
    fitted = cal.link
    link = Link(f"{fitted.name}, ranks computing", fitted.bandwidth_bytes_per_s, max(fitted.latency_s, per_step_s),
                source=fitted.source, latency_source="the larger of the sweep's fit and a call between computing ranks")
    rates = ranks.run(rate_on_rank, config)
    pass_s, step_s = (statistics.median(r[i] for r in rates) for i in (0, 1))
    flops = model_flops_per_token(config.model, config.seq) * config.microbatch * config.seq
    n_params = sum(v.numel() for v in init_weights(config).values())
    cluster = toy_cluster(link, flops_per_s=flops / pass_s, nodes=1, ranks_per_node=ranks.world_size)
    cluster = replace(cluster, memory_bytes_per_s=n_params * optimizer_bytes_per_param(config) / step_s)
    return StepCluster(cluster, cal, call_s, pass_s, step_s)


def measured_steps_s(run, warmup: int = 1) -> tuple[float, ...]:
    """Every step after the first ``warmup``: from the first rank's start to the last rank's end."""
    out = []
    for k in range(warmup, run.config.steps):
        spans = [s for s in run.spans if s.kind == "step" and s.attrs.get("step") == k]
        out.append(max(s.end_s for s in spans) - min(s.start_s for s in spans))
    return tuple(out)


@dataclass(frozen=True)
class LayoutTime:
    """One layout's step: predicted (``score``, term by term) and measured (every step after the warm-up)."""

    label: str
    layout: Layout
    score: TrainingScore
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
    wall_s: float

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

    def table(self) -> str:
        """Per layout: predicted (its terms), measured, ratio and error; then the mean error and ranking."""
        terms = ("compute", "bubble", "tp", "cp", "dp", "pp", "optimizer")
        lines = [f"{'layout':<17}{'m':>3}" + "".join(f"{t[:5]:>7}" for t in terms)
                 + f"{'predicted':>11}{'measured':>10}{'meas/pred':>10}{'error':>8}"]
        for t in self.layouts:
            lines.append(f"{t.label:<17}{t.score.n_microbatches:>3}"
                         + "".join(f"{getattr(t.score, name + '_s') * 1e3:>7.1f}" for name in terms)
                         + f"{t.predicted_s * 1e3:>11.1f}{t.measured_s * 1e3:>10.1f}{t.ratio:>10.2f}"
                         f"{t.error:>8.0%}")
        lines.append(f"(ms per step of {self.global_sequences} sequences of {self.config.seq} tokens; measured: "
                     f"median of {len(self.layouts[0].steps_s)} steps after a warm-up)")
        lines.append(f"mean error {self.mean_error:.0%}; Spearman's rank correlation {self.rank_correlation:+.2f}")
        lines.append("fastest first, predicted: " + ", ".join(self.by_predicted))
        lines.append("fastest first, measured:  " + ", ".join(self.by_measured))
        return "\n".join(lines)


def run_step_time_check(ranks, config: TrainingConfig = STEP_TIME_CONFIG, layouts: dict | None = None,
                        global_sequences: int = 4, warmup: int = 1, fit: StepCluster | None = None) -> StepTimeCheck:
    """Predict and measure one training step of every layout in ``layouts`` (label -> ``Layout``; the
    issue's 4-rank ones by default) on ``ranks``, all at ``global_sequences`` sequences per step.
    ``config.steps`` steps each, the first ``warmup`` left out of the median. Every layout is checked
    before any rank starts; ``fit`` (a ``StepCluster``) is measured here unless given."""
    layouts = dict(LAYOUTS_4 if layouts is None else layouts)
    whole_number(warmup, "warmup (steps left out of the median)", 0)
    if config.steps <= warmup:
        raise ValueError(f"{config.steps} steps leave none to time after {warmup} warm-up step(s): give "
                         f"config.steps > warmup")
    configs = {}
    for label, layout in layouts.items():
        if layout.world_size != ranks.world_size:
            raise ValueError(f"{label} needs {layout.world_size} ranks; the pool has {ranks.world_size}")
        configs[label] = step_config(config, layout, global_sequences)
        check_training(layout, configs[label])
    start = time.perf_counter()
    fit = fit_step_cluster(ranks, config) if fit is None else fit
    out = []
    for label, layout in layouts.items():
        run = run_training(ranks, layout, configs[label])
        out.append(LayoutTime(label, layout, predict_step(fit.cluster, layout, config, global_sequences),
                              measured_steps_s(run, warmup)))
    return StepTimeCheck(fit, config, global_sequences, tuple(out), time.perf_counter() - start)
