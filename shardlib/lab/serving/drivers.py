"""A layout run on a pool and checked against its prediction, and the toy cluster measured.

* ``run_combined``: ``ranks.combined_forward_on_rank`` on every rank, gathered into a ``CombinedRun``:
  the output (compare it with ``toy.stack_reference``), the comm log summed per mesh axis beside
  ``planner.forward_traffic``'s prediction, the time each axis spent in its calls.
* ``run_decode``: ``ranks.decode_on_rank``, steady-state pipelined decode, gathered into a ``DecodeRun``:
  each step's output (compare it with ``toy.decode_reference``), the time between two tokens of a
  sequence and the tokens per second, measured, with the calls that crossed an emulated slow link.
* ``run_toy_cluster_calibration``: the planner's toy cluster for a pool, with its link fitted on the
  ranks (``lab.costs.drivers.run_calibration``) and its arithmetic speed measured on the ranks.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from shardlib.core.checks import same_dtype, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, check_mesh
from shardlib.facts.hardware import Cluster, toy_cluster
from shardlib.lab.costs.drivers import run_calibration
from shardlib.lab.costs.emulation import EmulatedLink
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.serving.ranks import combined_forward_on_rank, decode_on_rank, effective_flops_on_rank
from shardlib.predict.calibration import Calibration
from shardlib.predict.serving.memory import stack_weight_bytes
from shardlib.predict.serving.traffic import AxisTraffic, forward_traffic
from shardlib.predict.shapes import check_tensor_parallel


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
        raise ValueError(f"{model.name} has experts: give its MoE weights (experts.stack.moe_stack_weights), "
                         "not a dense stack's")
    rows = x.shape[0] // max(layout.dp * n_microbatches, 1) * (x.shape[1] if x.dim() == 3 else 1)
    if x.dim() == 3 and x.shape[0] % (layout.dp * n_microbatches) == 0 and rows % layout.tp:
        raise ValueError(f"a microbatch of {rows} tokens does not split over tp = {layout.tp} ranks, each routing "
                         "an equal share to the experts")


def traffic_by_axis(records) -> list[AxisTraffic]:
    """The forward's comm log summed per (mesh axis, op), all ranks together; the start line (a
    barrier every rank passes before the forward) is not the forward's and is left out."""
    sums: dict[tuple[str, str], list[int]] = {}
    for r in forward_records(records):
        row = sums.setdefault((r.group, r.op), [0, 0])
        row[0] += 1
        row[1] += r.size_bytes
    return sorted((AxisTraffic(axis, op, n, b) for (axis, op), (n, b) in sums.items()), key=_axis_op)


def forward_records(records) -> list:
    """The records of the forward itself: every call but the start line's barrier."""
    return [r for r in records if r.op != "barrier"]


def _axis_op(a: AxisTraffic) -> tuple[str, str]:
    return a.axis, a.op


@dataclass(frozen=True)
class CombinedRun:
    layout: Layout
    output: torch.Tensor  # (batch, seq, d_model): the last stage's output, replicas in order
    last_stage_agree: bool  # every tp rank of every last stage returned the same tensor
    measured: tuple[AxisTraffic, ...]
    predicted: tuple[AxisTraffic, ...]
    comm_s_by_axis: dict  # axis -> seconds spent in its calls, summed over ranks
    wall_s: float  # from the start line (a barrier every rank has passed) to the last rank's end
    spans: tuple = ()  # every rank's timeline: compute per microbatch, and each call
    weight_bytes: tuple = ()  # per rank: the weights its stage keeps
    comm_bytes: tuple = ()  # per rank: the bytes of its forward's calls (comm.py's buffer count)


def run_combined(ranks, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 n_microbatches: int = 2) -> CombinedRun:
    """Check the inputs here, run ``combined_forward_on_rank`` on ``ranks``, gather outputs and the comm log."""
    check_mesh(layout, ranks.world_size, "ranks")
    check_combined_inputs(layout, model, layers, x, n_microbatches)
    got = on_ranks(ranks, combined_forward_on_rank, layout, model, layers, x, n_microbatches)
    last = [r for r in got.values if r.stage == layout.pp - 1]
    by_replica = [[r.output for r in last if r.replica == d] for d in range(layout.dp)]
    agree = all(torch.equal(o, outs[0]) for outs in by_replica for o in outs)
    forward = forward_records(ranks.last_comm)
    comm_s: dict[str, float] = {}
    for rec in forward:
        comm_s[rec.group] = comm_s.get(rec.group, 0.0) + rec.duration_s
    predicted = forward_traffic(model, layout, x.shape[0] // layout.dp, x.shape[1], n_microbatches)
    per_rank = [0] * ranks.world_size
    for rec in forward:
        per_rank[rec.rank] += rec.size_bytes
    return CombinedRun(layout, torch.cat([outs[0] for outs in by_replica]), agree,
                       tuple(traffic_by_axis(forward)), tuple(sorted(predicted, key=_axis_op)), comm_s,
                       max(got.each("end_s")) - min(got.each("start_s")), tuple(ranks.last_spans),
                       tuple(got.each("weight_bytes")), tuple(per_rank))


@dataclass(frozen=True)
class WideEPComparison:
    """Wide EP with data-parallel attention beside the same experts under tp attention, on one pool: each
    run's output, traffic per axis, and per rank the weights kept and the bytes sent, measured and predicted."""

    dp_attention: CombinedRun  # Layout(tp=1, dp=W, ep=W): attention replicated, each rank its own sequences
    tp_attention: CombinedRun  # Layout(tp=W, dp=1, ep=W): attention split by heads, each rank routes 1/W
    predicted_weight_bytes: tuple[tuple[int, ...], tuple[int, ...]]  # per layout, per rank
    predicted_comm_bytes: tuple[float, float]  # per layout: per rank, the mean (the combine's rows vary)

    def rows(self) -> list[dict]:
        """One row per layout: bytes per rank, measured and predicted (weights, and the forward's calls)."""
        out = []
        for name, run, w, c in zip(("wide EP, DP attention", "EP, TP attention"), (self.dp_attention,
                                   self.tp_attention), self.predicted_weight_bytes, self.predicted_comm_bytes):
            out.append({"layout": f"{name} ({run.layout.label})", "weights_measured": max(run.weight_bytes),
                        "weights_predicted": max(w), "comm_measured": sum(run.comm_bytes) / len(run.comm_bytes),
                        "comm_predicted": c})
        return out


def run_wide_ep(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor) -> WideEPComparison:
    """``x`` ``(batch, seq, d_model)`` through ``model``'s MoE stack on every rank of ``ranks`` twice: wide EP
    with data-parallel attention (``Layout(tp=1, pp=1, dp=W, ep=W)``: each rank attends to its own
    ``batch / W`` sequences with the whole attention, then its tokens go to the experts, spread over all
    ``W`` ranks), and the same experts under tensor-parallel attention (``Layout(tp=W, pp=1, ep=W)``: every
    rank attends to every sequence with ``1/W`` of the heads, one all-reduce, then routes ``1/W`` of the
    tokens and all-gathers the results). Compare each ``output`` with ``core.experts.stack.moe_stack_reference``."""
    w = ranks.world_size
    runs = [run_combined(ranks, lay, model, layers, x, 1) for lay in (Layout(1, 1, w, ep=w), Layout(w, 1, 1, ep=w))]
    weights = tuple(tuple(stack_weight_bytes(model, r.layout)) for r in runs)
    comm = tuple(sum(a.size_bytes for a in r.predicted) / w for r in runs)
    return WideEPComparison(runs[0], runs[1], weights, comm)


@dataclass(frozen=True)
class DecodeRun:
    layout: Layout
    outputs: torch.Tensor  # (steps, batch, 1, d_model): every step's output, replicas in order
    token_interval_s: float  # median time between two tokens of one microbatch, after the first step
    tokens_per_s: float  # the whole batch's tokens over that interval
    n_microbatches: int
    emulated_calls: int  # calls that crossed the emulated link, all ranks together
    comm_s_by_axis: dict  # axis -> seconds in its calls, summed over ranks
    spans: tuple = ()


def run_decode(ranks, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int,
               steps: int = 6, emulation: EmulatedLink | None = None) -> DecodeRun:
    """``steps`` decode steps of ``x`` (batch, 1, d_model) on ``ranks`` (``ranks.decode_on_rank``), checked
    here first. The interval between tokens is read on the last stage: for each microbatch, the time
    from its output at one step to its output at the next, median over steps 1.. and microbatches."""
    check_mesh(layout, ranks.world_size, "ranks")
    check_combined_inputs(layout, model, layers, x, n_microbatches)
    whole_number(steps, "steps (decode steps, at least 2 to time one interval)", minimum=2)
    if x.shape[1] != 1:
        raise ValueError(f"decode feeds one token per sequence: x must be (batch, 1, {model.d_model}), got "
                         f"{tuple(x.shape)}")
    if emulation is not None and len(emulation.node_of_rank) != ranks.world_size:
        raise ValueError(f"the emulated link places {len(emulation.node_of_rank)} ranks on nodes but the pool has "
                         f"{ranks.world_size}")
    res = ranks.run(decode_on_rank, layout, model, layers, x, n_microbatches, steps, emulation)
    last = Measured.of(sorted((r for r in res if r.stage == layout.pp - 1 and r.tp_rank == 0), key=lambda r: r.replica))
    ready = last.first("ready_s")  # (steps, m)
    interval_s = statistics.median(ready[k][i] - ready[k - 1][i] for k in range(1, steps) for i in range(len(ready[0])))
    comm_s: dict[str, float] = {}
    for rec in ranks.last_comm:
        comm_s[rec.group] = comm_s.get(rec.group, 0.0) + rec.duration_s
    return DecodeRun(layout, last.cat("outputs", dim=1), interval_s, x.shape[0] / interval_s,
                     len(ready[0]), sum(rec.emulated for rec in ranks.last_comm), comm_s, tuple(ranks.last_spans))


def format_traffic(run: CombinedRun) -> str:
    """Predicted and measured calls and bytes per mesh axis, as plain text (deterministic)."""
    lines = [f"{'axis':<5}{'op':<19}{'predicted':>22}{'measured':>22}"]
    measured = {(a.axis, a.op): a for a in run.measured}
    for p in run.predicted:
        m = measured.get((p.axis, p.op), AxisTraffic(p.axis, p.op, 0, 0))
        lines.append(f"{p.axis:<5}{p.op:<19}{f'{p.count} calls, {p.size_bytes:,} B':>22}"
                     f"{f'{m.count} calls, {m.size_bytes:,} B':>22}")
    return "\n".join(lines)


TOY_SWEEP_BYTES = (256, 16384, 1 << 20, 4 << 20)  # latency-bound to bandwidth-bound, a 4-rank sweep in ~1 s


@dataclass(frozen=True)
class ToyClusterFit:
    """The planner's toy cluster for a pool, built from numbers measured now, and the sweep behind it."""

    cluster: Cluster
    calibration: Calibration


def run_toy_cluster_calibration(ranks, model: ModelConfig, layers: list[dict], attempts: int = 3) -> ToyClusterFit:
    """The toy cluster (``hardware.toy_cluster``) for ``ranks``: its link fitted on the ranks, its
    arithmetic speed by ``effective_flops_per_s`` on every rank at once (the median rank), so that it
    counts the cores the ranks share. On a busy machine a short sweep can come out with
    times that do not grow with size (no bandwidth to fit): the sweep is then repeated, up to
    ``attempts`` times."""
    for attempt in range(attempts):
        try:
            cal = run_calibration(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2)
            break
        except ValueError:
            if attempt == attempts - 1:
                raise
    flops = statistics.median(ranks.run(effective_flops_on_rank, model, layers, 2, 6))  # every rank at once
    return ToyClusterFit(toy_cluster(cal.link, flops_per_s=flops), cal)
