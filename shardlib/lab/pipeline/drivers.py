"""Pipeline steps run on a pool: gathered, measured, and checked against the one-process reference.

* ``run_pipeline``: one step of a ``Schedule`` on the ranks (one stage per rank), gathered into a
  ``PipelineRun``: output, gradients, spans, comm log, the bubble measured, in-flight memory, and
  ``against_reference()`` for the exactness check.
* ``run_pipeline_median``: the same step several times, the median one kept (noise only adds time).
* ``run_bubble_curve``: the idle fraction measured against the formula for several microbatch counts,
  gathered into a ``BubbleCurve``.
* ``run_pipeline_vs_tp_bytes``: the bytes of one training step pipelined, against the same layers
  tensor-parallel, both read from the comm log.
* ``run_torch_runtime``: torch's own runtime for a zero-bubble schedule on the same ranks, against
  ``run_pipeline`` of the same order, gathered into a ``TorchRuntimeRun``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import TOLERANCE
from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.schedules import Schedule, check_count
from shardlib.lab.pipeline.ranks import StageResult, pipeline_step_on_rank
from shardlib.lab.pipeline.reference import check_pipeline_inputs, durations, unpipelined_step
from shardlib.lab.pipeline.torch_peer import check_torch_schedule, torch_runtime_on_rank
from shardlib.lab.tensor_parallel.ranks import tp_mlp_on_rank
from shardlib.predict.pipeline import MeasuredBubble, measure_bubble, pipeline_bubble_fraction
from shardlib.runtime.timeline import Span


@dataclass(frozen=True)
class Exactness:
    """A pipeline step against the one-process reference: ``bit_for_bit`` on the same microbatches
    (output, input gradient, every weight gradient), and the largest gap from one pass over the whole
    batch (``whole_batch_gap``, within ``TOLERANCE`` when ``whole_batch_close``)."""

    bit_for_bit: bool
    whole_batch_gap: float
    whole_batch_close: bool


@dataclass(frozen=True)
class PipelineRun:
    """One step run on the ranks, gathered: what each stage returned, the spans and the comm log."""

    schedule: Schedule
    per_rank: tuple[StageResult, ...]
    spans: list[Span]
    comm: list = field(repr=False)
    wall_s: float
    forward_s: object = None
    backward_s: object = None
    inputs: tuple = field(default=(), repr=False)  # (model, layers, x, grad_output): for against_reference

    @property
    def output(self) -> torch.Tensor:
        """The step's output, from the stage that holds the last layers."""
        return next(r.output for r in self.per_rank if r.output is not None)

    @property
    def grad_x(self) -> torch.Tensor | None:
        return self.per_rank[0].grad_x

    @property
    def grads(self) -> list[dict]:
        """Every layer's weight gradients, gathered from the stages, in layer order."""
        merged = {i: g for r in self.per_rank for i, g in r.grads.items()}
        return [merged[i] for i in sorted(merged)]

    @property
    def layers_held(self) -> list[list[int]]:
        """Per rank, the global layer indices it held (every chunk's together)."""
        return [[i for chunk in r.layers for i in chunk] for r in self.per_rank]

    @property
    def bubble(self) -> MeasuredBubble:
        return measure_bubble(self.spans, self.schedule.n_stages)

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        return tuple(r.peak_in_flight for r in self.per_rank)

    @property
    def peak_activation_bytes(self) -> tuple[int, ...]:
        return tuple(r.peak_activation_bytes for r in self.per_rank)

    @property
    def timing_note(self) -> str:
        """Which timing the run used, in words, for figure titles."""
        if self.forward_s is None and self.backward_s is None:
            return "real compute (no padding)"
        return (f"each op padded with sleep to a set duration (forward {_fmt(self.forward_s)}, "
                f"backward {_fmt(self.backward_s)})")

    def sent_bytes(self) -> int:
        """Bytes sent between stages this step, from the comm log (``send`` records, all ranks)."""
        return sum(r.size_bytes for r in self.comm if r.op == "send")

    def sent_messages(self) -> int:
        return sum(1 for r in self.comm if r.op == "send")

    def against_reference(self) -> Exactness:
        """This step against ``unpipelined_step`` on the same inputs (see ``Exactness``)."""
        model, layers, x, grad = self.inputs
        same = unpipelined_step(model, layers, x, self.schedule.n_microbatches, grad)
        whole = unpipelined_step(model, layers, x, 1, grad)
        pairs_same = [(self.output, same["output"])]
        pairs_whole = [(self.output, whole["output"])]
        if grad is not None:
            pairs_same.append((self.grad_x, same["grad_x"]))
            for mine, ref_same, ref_whole in zip(self.grads, same["grads"], whole["grads"]):
                pairs_same += [(mine[k], ref_same[k]) for k in ref_same]
                pairs_whole += [(mine[k], ref_whole[k]) for k in ref_whole]
        exact = len(self.grads) == (len(layers) if grad is not None else 0) and all(
            torch.equal(a, b) for a, b in pairs_same)
        gap = max(float((a - b).abs().max()) for a, b in pairs_whole)
        close = all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs_whole)
        return Exactness(exact, gap, close)


def _fmt(value) -> str:
    if value is None:
        return "real"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v * 1e3:g} ms" for v in value) + "]"
    return f"{value * 1e3:g} ms"


def run_pipeline(ranks, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None,
                 layer_counts=None, weight_s=None) -> PipelineRun:
    """Check the inputs here (a clear ValueError before any rank starts), run one step of ``schedule``
    on ``ranks`` (``pipeline_step_on_rank``), and gather the result. ``layer_counts``: layers per stage,
    unequal on purpose (``None``: as even as whole layers allow). ``weight_s`` pads each W (the weight
    gradient) as ``forward_s`` and ``backward_s`` pad F and B (a schedule without W pads its whole backward
    to ``backward_s + weight_s``); ``None`` for real compute."""
    check_pipeline_inputs(schedule, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ranks.world_size, x.dtype, layer_counts)
    for value, name in ((forward_s, "forward_s"), (backward_s, "backward_s"), (weight_s, "weight_s")):
        durations(value, schedule.n_stages, name)
    start = time.perf_counter()
    per_rank = ranks.run(pipeline_step_on_rank, schedule, model, layers, x, grad_output, forward_s, backward_s,
                         layer_counts=layer_counts, weight_s=weight_s)
    wall = time.perf_counter() - start
    return PipelineRun(schedule, tuple(per_rank), list(ranks.last_spans), list(ranks.last_comm), wall, forward_s,
                       backward_s, (model, layers, x, grad_output))


def run_pipeline_median(ranks, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                        grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None,
                        repeats: int = 3, layer_counts=None) -> PipelineRun:
    """Run the step ``repeats`` times and return the run with the median step time (window): one
    run stalled by another process on a shared machine does not decide the answer."""
    repeats = check_count("repeats", repeats, "runs to take the median of")
    runs = [run_pipeline(ranks, schedule, model, layers, x, grad_output, forward_s, backward_s, layer_counts)
            for _ in range(repeats)]
    return sorted(runs, key=lambda r: r.bubble.window_s)[(repeats - 1) // 2]


@dataclass(frozen=True)
class BubblePoint:
    """The idle fraction of one training step, predicted by the formula and measured on the ranks.
    ``attempts`` holds every measurement made (one, or three); ``measured`` is the least idle of them: with
    every op padded to a set duration, a stall on a shared machine only ever adds idle time, so the least
    idle attempt is the least disturbed one."""

    n_stages: int
    n_microbatches: int
    predicted: float
    attempts: tuple[float, ...]

    @property
    def measured(self) -> float:
        return min(self.attempts)


@dataclass(frozen=True)
class BubbleCurve:
    """The idle fraction of schedule ``name`` on ``n_stages`` ranks, one ``BubblePoint`` per microbatch
    count, every forward and backward padded to ``op_s`` seconds."""

    name: str
    n_stages: int
    op_s: float
    points: tuple[BubblePoint, ...]


def run_bubble_curve(ranks, name: str, microbatches, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     grad_output: torch.Tensor, op_s: float, remeasure_over: float | None = 0.03) -> BubbleCurve:
    """Measure the idle fraction of a training step of schedule ``name`` on ``ranks`` for each ``m`` in
    ``microbatches``, every forward and backward padded to ``op_s`` seconds (uniform stages).

    One short warm-up step runs first (imports and first messages on every rank). A point further than
    ``remeasure_over`` from the formula is measured twice more and the least idle of the three kept: on a
    shared machine another process can stall a run (a stall only ever adds idle time), and one stalled
    run should not decide the point. Every measurement stays in ``attempts``.
    """
    p = ranks.world_size
    run_pipeline(ranks, make_schedule(name, p, 1), model, layers, x, grad_output, forward_s=0.001, backward_s=0.001)
    points = []
    for m in microbatches:
        schedule = make_schedule(name, p, m)
        predicted = pipeline_bubble_fraction(p, m)

        def measure() -> float:
            return run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s).bubble.idle_fraction

        attempts = [measure()]
        if remeasure_over is not None and abs(attempts[0] - predicted) > remeasure_over:
            attempts += [measure(), measure()]
        points.append(BubblePoint(p, m, predicted, tuple(attempts)))
    return BubbleCurve(name, p, op_s, tuple(points))


@dataclass(frozen=True)
class PipelineVsTPBytes:
    """One training step of the same layers on the same ranks, pipelined and tensor-parallel, from the
    comm logs: the pipeline's sends (all ranks together), and one rank's all-reduces under tensor
    parallelism (each layer's MLP split across the ranks, as in ``tensor_parallel``)."""

    activation_bytes: int  # the whole batch's activations: batch x seq x d_model x 4
    pipeline_messages: int
    pipeline_bytes: int
    tp_collectives_per_rank: int
    tp_bytes_per_rank: int

    @property
    def ratio(self) -> float:
        """Tensor parallelism's bytes per rank over the whole pipeline's bytes."""
        return self.tp_bytes_per_rank / self.pipeline_bytes


def run_pipeline_vs_tp_bytes(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             grad_output: torch.Tensor, n_microbatches: int = 4) -> PipelineVsTPBytes:
    """Count the bytes of one training step (1F1B, ``n_microbatches``) of MLP-only ``layers`` both ways."""
    if any("q" in w for w in layers):
        raise ValueError("the comparison splits each layer's MLP: give MLP-only layers (parts=('mlp',))")
    pp = run_pipeline(ranks, make_schedule("1f1b", ranks.world_size, n_microbatches), model, layers, x, grad_output)
    calls = size = 0
    for w in layers:
        rank0 = ranks.run(tp_mlp_on_rank, x, w, grad_output)[0]
        calls += rank0.forward_collectives + rank0.backward_collectives
        size += rank0.forward_bytes + rank0.backward_bytes
    return PipelineVsTPBytes(x.numel() * x.element_size(), pp.sent_messages(), pp.sent_bytes(), calls, size)


@dataclass(frozen=True)
class TorchRuntimeRun:
    """torch's runtime for schedule ``name`` (``PipelineStage`` s and the schedule's ``step``) on the pool:
    its ``output`` and every layer's weight ``grads`` in layer order, its ``step_s`` (the slowest rank's),
    its action ``grid``, and ``ours``, ``run_pipeline`` of the same order on this package's engine."""

    name: str
    output: torch.Tensor
    grads: list[dict]
    step_s: float
    grid: list[list[str]]
    ours: PipelineRun = field(repr=False)

    def _pairs(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [(self.output, self.ours.output)] + [(theirs[k], ours[k]) for theirs, ours in
                                                    zip(self.grads, self.ours.grads, strict=True) for k in ours]

    @property
    def bit_for_bit(self) -> bool:
        """Output and every weight gradient equal to ``ours``, bit for bit."""
        return all(torch.equal(a, b) for a, b in self._pairs())

    @property
    def largest_gap(self) -> float:
        return max(float((a - b).abs().max()) for a, b in self._pairs())

    @property
    def close(self) -> bool:  # within TOLERANCE of ``ours`` everywhere
        return all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in self._pairs())


def run_torch_runtime(ranks, name: str, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                      grad_output: torch.Tensor, n_microbatches: int) -> TorchRuntimeRun:
    """One training step of torch's ``Schedule{name}`` (a key of ``TORCH_SCHEDULES``) run by torch on
    ``ranks`` (``torch_runtime_on_rank``), then the same order run by ``run_pipeline``, gathered.
    torch's own checks of ``n_microbatches`` come first, as a ValueError, before any rank starts; torch's
    runtime also needs microbatches of equal rows."""
    check_torch_schedule(name, ranks.world_size, n_microbatches)
    same_cut = make_schedule("zb-v", ranks.world_size, n_microbatches)  # 2 p slices, as torch cuts them
    check_pipeline_inputs(same_cut, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ranks.world_size, x.dtype)
    if x.shape[0] % n_microbatches:
        raise ValueError(f"torch's PipelineStage sizes its receive buffers from the first microbatch, so every "
                         f"microbatch needs as many rows: {n_microbatches} microbatches must divide the batch's "
                         f"{x.shape[0]} rows")
    per_rank = ranks.run(torch_runtime_on_rank, name, model, layers, x, grad_output, n_microbatches)
    merged = {i: g for r in per_rank for i, g in r["grads"].items()}
    output = next(r["output"] for r in per_rank if r["output"] is not None)
    return TorchRuntimeRun(name, output, [merged[i] for i in sorted(merged)], max(r["step_s"] for r in per_rank),
                           per_rank[0]["grid"], run_pipeline(ranks, per_rank[0]["schedule"], model, layers, x,
                                                             grad_output))
