"""A layout run on a pool and checked against its prediction, and the toy cluster measured.

* ``combined_forward_on_rank`` / ``decode_on_rank``: ``layouts.run_round`` for one step and for several
  on a rank, each microbatch a span on its timeline (a decode over an ``EmulatedLink`` between "nodes").
* ``run_combined``: one forward on every rank, read as a ``CombinedRun``: the output, the comm log summed per
  mesh axis beside ``traffic.forward_traffic``, each rank's weights.
* ``run_wide_ep``: wide EP with data-parallel attention beside the same experts under tp attention.
* ``run_decode``: steady-state pipelined decode, read as a ``DecodeRun``: each step's output, the time
  between two tokens of a sequence, the calls that crossed an emulated link.
* ``effective_flops_per_s``: how fast a rank computes the toy stack.
* ``run_toy_cluster_calibration``: the planner's toy cluster for a pool, its link and arithmetic speed
  measured on the ranks.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from shardlib.core.checks import same_dtype, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, check_mesh
from shardlib.core.model import stack_reference
from shardlib.core.serving.layouts import build_stage, run_round
from shardlib.core.toy import activations
from shardlib.facts.hardware import Cluster, toy_cluster
from shardlib.lab.costs.calibration import run_calibration
from shardlib.lab.costs.emulation import EmulatedLink
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import refitted
from shardlib.predict.alpha_beta import Calibration
from shardlib.predict.serving.memory import active_params_per_gpu, stack_weight_bytes
from shardlib.predict.serving.traffic import AxisTraffic, forward_traffic
from shardlib.predict.shapes import check_tensor_parallel


def held_weight_bytes(me) -> int:
    """Bytes of the weights a rank's stage holds (``layouts.RankStage``): its blocks' parameters, and of an
    MoE model each layer's router and the experts at its place of the ep group."""
    tensors = [p for block in me.blocks for p in block.parameters()]
    tensors += [t for part in me.experts for t in (part.router, *part.local)]
    return sum(t.numel() * t.element_size() for t in tensors)


def combined_forward_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             n_microbatches: int = 2) -> dict:
    """``x`` (batch, seq, d_model) forward on ``layout``'s mesh: the output on the last stage (else ``None``)
    and the bytes of the weights this rank's stage keeps."""
    me = build_stage(ctx, layout, model, layers)
    outputs = run_round(ctx, layout, me, x, n_microbatches, 1, probe=ctx.timeline)
    return {"output": torch.cat(outputs) if outputs else None, "weight_bytes": held_weight_bytes(me)}


def decode_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                   n_microbatches: int, steps: int, emulation=None) -> list[torch.Tensor] | None:
    """``steps`` decode steps of ``x`` (batch, 1, d_model): on tp rank 0 of the last stage every microbatch's
    output, step by step, else ``None``. ``emulation`` makes calls that cross "nodes" last as that link would."""
    ctx.comm.emulate(emulation)
    me = build_stage(ctx, layout, model, layers)
    outputs = run_round(ctx, layout, me, x, n_microbatches, steps, probe=ctx.timeline)
    return outputs if me.tp_rank == 0 else None


def check_combined_inputs(layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          n_microbatches: int) -> None:
    """Every shape rule, checked before any rank starts, with the numbers."""
    whole_number(n_microbatches, "n_microbatches")
    if layout.ep != 1 and not model.is_moe:
        raise ValueError(f"the combined run on ranks splits dense blocks: ep must be 1, got ep = {layout.ep}")
    if model.is_moe:
        check_expert_inputs(layout, model, layers, x, n_microbatches)
    check_tensor_parallel(model, layout.tp)
    if len(layers) != model.n_layers:
        raise ValueError(f"{model.name} has {model.n_layers} layers but {len(layers)} sets of weights were given")
    if layout.pp > model.n_layers:  # stages may be uneven (the slowest sets the pace), but none may be empty
        raise ValueError(f"{model.n_layers} layers cannot fill {layout.pp} stages: each stage needs a whole layer")
    if x.dim() != 3 or x.shape[-1] != model.d_model:
        raise ValueError(f"x must be (batch, seq, d_model = {model.d_model}), got {tuple(x.shape)}")
    weights = [t for t in layers[0].values() if isinstance(t, torch.Tensor)] if layers else []
    if weights:
        same_dtype(x.dtype, weights[0].dtype, "x's dtype")
    rows, pieces = x.shape[0], layout.dp * n_microbatches
    if rows % pieces:
        raise ValueError(f"a batch of {rows} sequences cannot be cut into dp x m = {layout.dp} x {n_microbatches} = "
                         f"{pieces} equal microbatches ({rows} % {pieces} = {rows % pieces})")


def check_expert_inputs(layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                        n_microbatches: int) -> None:
    """The rules an MoE model adds: whole experts per rank, ep inside a stage, MoE weights, and tokens
    that split evenly over the tp ranks that route them."""
    ep, per_stage = layout.ep, layout.tp * layout.dp
    if model.n_experts % ep:
        raise ValueError(f"ep = {ep} does not divide the {model.n_experts} experts of {model.name}: each rank holds "
                         f"whole experts ({model.n_experts} / {ep} = {model.n_experts / ep:.3g})")
    if per_stage % ep:
        raise ValueError(f"ep = {ep} must divide the tp x dp = {layout.tp} x {layout.dp} = {per_stage} ranks of a "
                         "stage: each stage's experts are spread over its own ranks, whole")
    if layers and "router" not in layers[0]:
        raise ValueError(f"{model.name} has experts: give its MoE weights (core.experts.dispatch.moe_stack_weights), "
                         "not a dense stack's")
    rows = x.shape[0] // max(layout.dp * n_microbatches, 1) * (x.shape[1] if x.dim() == 3 else 1)
    if x.dim() == 3 and x.shape[0] % (layout.dp * n_microbatches) == 0 and rows % layout.tp:
        raise ValueError(f"a microbatch of {rows} tokens does not split over tp = {layout.tp} ranks, each routing "
                         "an equal share to the experts")


def traffic_by_axis(records) -> list[AxisTraffic]:
    """A comm log summed per (mesh axis, op), all ranks together, barriers left out."""
    sums: dict[tuple[str, str], list[int]] = {}
    for r in records:
        if r.op != "barrier":
            row = sums.setdefault((r.group, r.op), [0, 0])
            row[0], row[1] = row[0] + 1, row[1] + r.size_bytes
    return [AxisTraffic(axis, op, n, b) for (axis, op), (n, b) in sorted(sums.items())]  # by axis, then op


@dataclass(frozen=True)
class CombinedRun:
    """One forward of a layout on live ranks (``got``: what ``on_ranks`` gathered from
    ``combined_forward_on_rank``), beside the traffic ``forward_traffic`` predicted."""

    got: Measured
    layout: Layout
    predicted: tuple[AxisTraffic, ...]

    def _last_stage(self, replica: int) -> list[torch.Tensor]:  # each tp rank's (rows, seq, d_model)
        return [v["output"] for r, v in zip(self.got.ranks, self.got.values)
                if self.layout.coords(r)[:2] == (self.layout.pp - 1, replica)]

    @property
    def output(self) -> torch.Tensor:  # (batch, seq, d_model): the last stage's output, replicas in order
        return torch.cat([self._last_stage(d)[0] for d in range(self.layout.dp)])

    @property
    def last_stage_agree(self) -> bool:  # every tp rank of every last stage returned the same tensor
        return all(torch.equal(o, outs[0]) for d in range(self.layout.dp) for outs in [self._last_stage(d)]
                   for o in outs)

    measured = property(lambda self: tuple(traffic_by_axis(self.got.records())))
    spans = property(lambda self: self.got.spans())  # every rank's timeline: compute per microbatch, each call
    weight_bytes = property(lambda self: self.got.each("weight_bytes"))  # per rank: the weights its stage keeps

    @property
    def wall_s(self) -> float:  # the first rank's first span to the last rank's last: the forward itself
        return max(s.end_s for s in self.spans) - min(s.start_s for s in self.spans)

    @property
    def comm_bytes(self) -> tuple[int, ...]:  # per rank: the bytes of its forward's calls
        return tuple(self.got.bytes(rank=r) for r in range(self.layout.world_size))


def run_combined(ranks, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 n_microbatches: int = 2) -> CombinedRun:
    """Check the inputs here, then run ``combined_forward_on_rank`` on every rank of ``ranks``."""
    check_mesh(layout, ranks.world_size, "ranks")
    check_combined_inputs(layout, model, layers, x, n_microbatches)
    got = on_ranks(ranks, combined_forward_on_rank, layout, model, layers, x, n_microbatches)
    predicted = forward_traffic(model, layout, x.shape[0] // layout.dp, x.shape[1], n_microbatches)
    return CombinedRun(got, layout, tuple(sorted(predicted, key=lambda a: (a.axis, a.op))))


@dataclass(frozen=True)
class WideEPComparison:
    """Wide EP with data-parallel attention beside the same experts under tp attention, on one pool."""

    dp_attention: CombinedRun  # Layout(tp=1, dp=W, ep=W): attention replicated, each rank its own sequences
    tp_attention: CombinedRun  # Layout(tp=W, dp=1, ep=W): attention split by heads, each rank routes 1/W
    model: ModelConfig

    def rows(self) -> list[dict]:
        """One row per layout: bytes per rank, measured and predicted (weights, and the forward's calls)."""
        runs = {"wide EP, DP attention": self.dp_attention, "EP, TP attention": self.tp_attention}
        return [{"layout": f"{name} ({run.layout.label})", "weights_measured": max(run.weight_bytes),
                 "weights_predicted": max(stack_weight_bytes(self.model, run.layout)),
                 "comm_measured": sum(run.comm_bytes) / len(run.comm_bytes),  # the mean: the combine's rows vary
                 "comm_predicted": sum(a.size_bytes for a in run.predicted) / run.layout.world_size}
                for name, run in runs.items()]


def run_wide_ep(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor) -> WideEPComparison:
    """``x`` (batch, seq, d_model) through ``model``'s MoE stack on every rank twice. Wide EP with DP attention
    (``Layout(tp=1, pp=1, dp=W, ep=W)``): each rank attends to its own ``batch / W`` sequences, then its tokens
    go to the experts on all ``W`` ranks. TP attention (``Layout(tp=W, pp=1, ep=W)``): every rank attends to
    every sequence with ``1/W`` of the heads, one all-reduce, then routes ``1/W`` of the tokens and all-gathers
    the results. Compare each ``output`` with ``core.experts.dispatch.moe_stack_reference``."""
    w = ranks.world_size
    dp, tp = (run_combined(ranks, lay, model, layers, x, 1) for lay in (Layout(1, 1, w, ep=w), Layout(w, 1, 1, ep=w)))
    return WideEPComparison(dp, tp, model)


@dataclass(frozen=True)
class DecodeRun:
    """Pipelined decode on live ranks (``got``: from ``decode_on_rank``, answered by tp rank 0 of each
    replica's last stage, replicas in rank order). Times are medians over the repeats."""

    got: Measured
    layout: Layout
    n_microbatches: int

    def _steps(self, outputs) -> torch.Tensor:  # (steps, batch, 1, d_model), replicas in order
        m = self.n_microbatches
        return torch.cat([torch.stack([torch.cat(outs[k:k + m]) for k in range(0, len(outs), m)]) for outs in outputs],
                         dim=1)

    outputs = property(lambda self: self._steps(self.got.values))  # the last repeat's every step

    def each_repeat_outputs(self) -> list[torch.Tensor]:
        """``outputs`` of every repeat."""
        return [self._steps(outs) for outs in zip(*self.got.each_repeat())]

    def _interval_s(self, repeat: int) -> float:
        """Per microbatch, its output at one step to its output at the next (a compute span's end), median
        over steps 1.. and microbatches, on the first replica's last stage."""
        m = self.n_microbatches
        ready = [s.end_s for s in self.got.spans(rank=self.got.ranks[0], repeat=repeat) if s.kind == "compute"]
        return statistics.median(ready[j] - ready[j - m] for j in range(m, len(ready)))

    @property
    def token_interval_s(self) -> float:  # median time between two tokens of one microbatch, after the first step
        return statistics.median(self._interval_s(i) for i in range(len(self.got.times_s[0])))

    tokens_per_s = property(lambda self: self.outputs.shape[1] / self.token_interval_s)  # the batch's tokens
    emulated_calls = property(lambda self: sum(r.emulated for r in self.got.records()))  # the last repeat's
    spans = property(lambda self: self.got.spans())


def run_decode(ranks, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int,
               steps: int = 6, emulation: EmulatedLink | None = None, repeats: int = 1) -> DecodeRun:
    """``steps`` decode steps of ``x`` (batch, 1, d_model) on ``ranks`` (``decode_on_rank``), ``repeats``
    times, the inputs checked here first."""
    check_mesh(layout, ranks.world_size, "ranks")
    check_combined_inputs(layout, model, layers, x, n_microbatches)
    whole_number(steps, "steps (decode steps, at least 2 to time one interval)", minimum=2)
    if x.shape[1] != 1:
        raise ValueError(f"decode feeds one token per sequence: x must be (batch, 1, {model.d_model}), got "
                         f"{tuple(x.shape)}")
    if emulation is not None and len(emulation.node_of_rank) != ranks.world_size:
        raise ValueError(f"the emulated link places {len(emulation.node_of_rank)} ranks on nodes but the pool has "
                         f"{ranks.world_size}")
    got = on_ranks(ranks, decode_on_rank, layout, model, layers, x, n_microbatches, steps, emulation, repeats=repeats)
    return DecodeRun(got, layout, n_microbatches)


def effective_flops_per_s(ctx, model: ModelConfig, layers: list[dict], batch: int, seq: int,
                          repeats: int = 10) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters x
    tokens`` (``memory.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of ``batch``
    sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch overhead
    dominates, and the toy's compute proxy should include it. ``ctx`` is unused: a rank function."""
    x = activations(batch, seq, model.d_model)  # (batch, seq, d_model)
    best_s = float("inf")
    with torch.no_grad():
        stack_reference(x, layers, model)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            stack_reference(x, layers, model)
            best_s = min(best_s, time.perf_counter() - start)
    return 2 * active_params_per_gpu(model, Layout(tp=1, pp=1)) * batch * seq / best_s


TOY_SWEEP_BYTES = (256, 16384, 1 << 20, 4 << 20)  # latency-bound to bandwidth-bound, a 4-rank sweep in ~1 s


@dataclass(frozen=True)
class ToyClusterFit:
    """The planner's toy cluster for a pool, built from numbers measured now, and the sweep behind it."""

    cluster: Cluster
    calibration: Calibration


def run_toy_cluster_calibration(ranks, model: ModelConfig, layers: list[dict], attempts: int = 3) -> ToyClusterFit:
    """The toy cluster (``hardware.toy_cluster``) for ``ranks``: its link fitted on the ranks, its arithmetic
    speed the median rank's ``effective_flops_per_s``, every rank at once (so it counts the cores they
    share). On a busy machine a short sweep can give times that do not grow with size (no bandwidth to
    fit): the sweep is then taken again, up to ``attempts`` times in all."""
    cal = refitted(lambda _: run_calibration(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2), attempts)
    flops = statistics.median(on_ranks(ranks, effective_flops_per_s, model, layers, 2, 6).each())
    return ToyClusterFit(toy_cluster(cal.link, flops_per_s=flops), cal)
