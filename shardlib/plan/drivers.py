"""A layout run on a pool and checked against its prediction, and the toy cluster measured.

* ``run_combined``: ``ranks.combined_forward_on_rank`` on every rank, gathered into a ``CombinedRun``:
  the output (compare it with ``toy.stack_reference``), the comm log summed per mesh axis beside
  ``planner.forward_traffic``'s prediction, the time each axis spent in its calls.
* ``run_toy_cluster_calibration``: the planner's toy cluster for a pool, with its link fitted on the
  ranks (``costs.drivers.run_calibration``) and its arithmetic speed measured in this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..checks import same_dtype, whole_number
from ..costs.calibration import Calibration
from ..costs.drivers import run_calibration
from ..hardware import Cluster, toy_cluster
from ..models import ModelConfig, check_tensor_parallel
from ..toy import activations, stack_reference
from .layout import Layout, check_mesh
from .memory import active_params_per_gpu
from .traffic import AxisTraffic, forward_traffic
from .ranks import combined_forward_on_rank

TOLERANCE = 1e-5  # atol = rtol: the tensor-parallel sums add partials in another order than one matmul


def check_combined_inputs(layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          n_microbatches: int) -> None:
    """Every shape rule, checked before any rank starts, with the numbers."""
    whole_number(n_microbatches, "n_microbatches")
    if layout.ep != 1:
        raise ValueError(f"the combined run on ranks splits dense blocks: ep must be 1, got ep = {layout.ep}")
    check_tensor_parallel(model, layout.tp)
    if len(layers) != model.n_layers:
        raise ValueError(f"{model.name} has {model.n_layers} layers but {len(layers)} sets of weights were given")
    if model.n_layers % layout.pp:
        raise ValueError(f"{model.n_layers} layers cannot be cut into {layout.pp} equal stages "
                         f"({model.n_layers} % {layout.pp} = {model.n_layers % layout.pp})")
    if x.dim() != 3 or x.shape[-1] != model.d_model:
        raise ValueError(f"x must be (batch, seq, d_model = {model.d_model}), got {tuple(x.shape)}")
    weights = [t for t in layers[0].values() if isinstance(t, torch.Tensor)] if layers else []
    if weights:
        same_dtype(x.dtype, weights[0].dtype, "x's dtype")
    rows, pieces = x.shape[0], layout.dp * n_microbatches
    if rows % pieces:
        raise ValueError(f"a batch of {rows} sequences cannot be cut into dp x m = {layout.dp} x {n_microbatches} = "
                         f"{pieces} equal microbatches ({rows} % {pieces} = {rows % pieces})")


def traffic_by_axis(records) -> list[AxisTraffic]:
    """The comm log summed per (mesh axis, op), all ranks together."""
    sums: dict[tuple[str, str], list[int]] = {}
    for r in records:
        row = sums.setdefault((r.group, r.op), [0, 0])
        row[0] += 1
        row[1] += r.size_bytes
    return sorted((AxisTraffic(axis, op, n, b) for (axis, op), (n, b) in sums.items()), key=_axis_op)


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
    wall_s: float  # first rank's start to last rank's end
    spans: tuple = ()  # every rank's timeline: compute per microbatch, and each call


def run_combined(ranks, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 n_microbatches: int = 2) -> CombinedRun:
    """Check the inputs here, run ``combined_forward_on_rank`` on ``ranks``, gather outputs and the comm log."""
    check_mesh(layout, ranks.world_size, "ranks")
    check_combined_inputs(layout, model, layers, x, n_microbatches)
    res = ranks.run(combined_forward_on_rank, layout, model, layers, x, n_microbatches)
    last = [r for r in res if r["stage"] == layout.pp - 1]
    by_replica = [[r["output"] for r in last if r["replica"] == d] for d in range(layout.dp)]
    agree = all(torch.equal(o, outs[0]) for outs in by_replica for o in outs)
    comm_s: dict[str, float] = {}
    for rec in ranks.last_comm:
        comm_s[rec.group] = comm_s.get(rec.group, 0.0) + rec.duration_s
    predicted = forward_traffic(model, layout, x.shape[0] // layout.dp, x.shape[1], n_microbatches)
    return CombinedRun(layout, torch.cat([outs[0] for outs in by_replica]), agree,
                       tuple(traffic_by_axis(ranks.last_comm)), tuple(sorted(predicted, key=_axis_op)), comm_s,
                       max(r["end_s"] for r in res) - min(r["start_s"] for r in res), tuple(ranks.last_spans))


def format_traffic(run: CombinedRun) -> str:
    """Predicted and measured calls and bytes per mesh axis, as plain text (deterministic)."""
    lines = [f"{'axis':<5}{'op':<19}{'predicted':>22}{'measured':>22}"]
    measured = {(a.axis, a.op): a for a in run.measured}
    for p in run.predicted:
        m = measured.get((p.axis, p.op), AxisTraffic(p.axis, p.op, 0, 0))
        lines.append(f"{p.axis:<5}{p.op:<19}{f'{p.count} calls, {p.size_bytes:,} B':>22}"
                     f"{f'{m.count} calls, {m.size_bytes:,} B':>22}")
    return "\n".join(lines)


def effective_flops_per_s(model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 5) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters
    x tokens`` (``memory.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of
    ``batch`` sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch
    overhead dominates, and that is what the toy's compute proxy should include."""
    x = activations(batch, seq, model.d_model)
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
    """The toy cluster (``hardware.toy_cluster``) for ``ranks``: its link fitted on the ranks, its
    arithmetic speed by ``effective_flops_per_s``. On a busy machine a short sweep can come out with
    times that do not grow with size (no bandwidth to fit): the sweep is then repeated, up to
    ``attempts`` times."""
    for attempt in range(attempts):
        try:
            cal = run_calibration(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2)
            break
        except ValueError:
            if attempt == attempts - 1:
                raise
    return ToyClusterFit(toy_cluster(cal.link, flops_per_s=effective_flops_per_s(model, layers, batch=2, seq=6)), cal)
