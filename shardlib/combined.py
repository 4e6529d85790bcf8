"""Tensor parallelism inside a "node", pipeline stages across "nodes": a 2-D mesh on real ranks.

The mesh numbers ranks as ``plan.py`` does, tensor-parallel rank innermost and stage outermost::

    rank = (stage * dp + replica) * tp + tp_rank

so on 4 ranks with ``pp = 2, tp = 2`` ranks {0, 1} are stage 0 and {2, 3} stage 1: each stage is one
"node" whose two ranks split every layer (Megatron-LM, Shoeybi et al. 2019), and activations cross
between the nodes by point-to-point sends (GPipe-style forward, Huang et al. 2019). Every collective
goes through ``ctx.comm`` on a named process group (``"tp"`` or ``"pp"``), so the comm log splits by
mesh axis: many all-reduces on the tp axis, a few sends and receives on the pp axis.

The layers are pre-norm residual transformer blocks shaped by a ``ModelConfig`` (grouped-query causal
attention, then Llama's gated MLP; RMS norms without a learned scale; no embedding or output head).
The functions of ``tp_ranks.py`` split over the whole world (``ctx.world_size``, ``ctx.comm`` without a
group), so the tensor-parallel block here is rebuilt from the same parts (``shard_columns``,
``shard_rows``, the references) with its all-reduce on the tp group. Forward only: serving.

Each rank receives the full weights and computes with only its slices (cut on the fly with
``shard_columns`` / ``shard_rows``); a real deployment loads only the slices.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .checks import same_dtype, whole_number
from .models import ModelConfig, check_tensor_parallel
from .pipeline import split_layers
from .plan import AxisTraffic, Layout, active_params_per_gpu, forward_traffic
from .tensor_parallel import shard_columns, shard_rows
from .tp_ranks import attention_reference, mlp_reference, toy_block_weights

TOLERANCE = 1e-5  # atol = rtol: the tensor-parallel sums add partials in another order than one matmul


@dataclass(frozen=True)
class Mesh:
    """``pp`` stages x ``dp`` replicas x ``tp`` tensor-parallel ranks."""

    pp: int
    tp: int
    dp: int = 1

    def __post_init__(self) -> None:
        for name in ("pp", "tp", "dp"):
            whole_number(getattr(self, name), f"mesh {name}")

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def layout(self) -> Layout:
        return Layout(self.tp, self.pp, self.dp)

    def rank(self, stage: int, replica: int, tp_rank: int) -> int:
        return (stage * self.dp + replica) * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(stage, replica, tp_rank)`` of ``rank``."""
        block, tp_rank = divmod(rank, self.tp)
        stage, replica = divmod(block, self.dp)
        return stage, replica, tp_rank

    def tp_groups(self) -> list[list[int]]:
        return [[self.rank(s, d, t) for t in range(self.tp)] for s in range(self.pp) for d in range(self.dp)]

    def pp_groups(self) -> list[list[int]]:
        return [[self.rank(s, d, t) for s in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise ValueError(f"pp x dp x tp = {self.pp} x {self.dp} x {self.tp} = {self.world_size}, but there are "
                             f"{world_size} ranks: the mesh must multiply to the world size")


def check_inputs(mesh: Mesh, model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int) -> None:
    """Every shape rule, checked before any rank starts, with the numbers."""
    whole_number(n_microbatches, "n_microbatches")
    check_tensor_parallel(model, mesh.tp)
    if len(layers) != model.n_layers:
        raise ValueError(f"{model.name} has {model.n_layers} layers but {len(layers)} sets of weights were given")
    if model.n_layers % mesh.pp:
        raise ValueError(f"{model.n_layers} layers cannot be cut into {mesh.pp} equal stages "
                         f"({model.n_layers} % {mesh.pp} = {model.n_layers % mesh.pp})")
    if x.dim() != 3 or x.shape[-1] != model.d_model:
        raise ValueError(f"x must be (batch, seq, d_model = {model.d_model}), got {tuple(x.shape)}")
    weights = [t for t in layers[0].values() if isinstance(t, torch.Tensor)] if layers else []
    if weights:
        same_dtype(x.dtype, weights[0].dtype, "x's dtype")
    rows = x.shape[0]
    if rows % (mesh.dp * n_microbatches):
        raise ValueError(f"a batch of {rows} sequences cannot be cut into dp x m = {mesh.dp} x {n_microbatches} = "
                         f"{mesh.dp * n_microbatches} equal microbatches ({rows} % {mesh.dp * n_microbatches} = "
                         f"{rows % (mesh.dp * n_microbatches)})")


# -- the model and its reference --------------------------------------------------------------------------
def stack_weights(model: ModelConfig, seed: int = 0) -> list[dict]:
    """Reproducible weights for ``model.n_layers`` blocks (attention q, k, v, o and MLP gate, up, down)."""
    out = []
    for i in range(model.n_layers):
        w = toy_block_weights(seed + i, model.d_model, model.d_ff, model.n_heads, model.n_kv_heads, model.head_dim)
        out.append({k: w[k] for k in ("q", "k", "v", "o", "gate", "up", "down")})
    return out


def stack_input(model: ModelConfig, batch: int, seq: int, seed: int = 100) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seq, model.d_model, generator=g)  # (batch, seq, d_model)


def _norm(h: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(h, (h.shape[-1],))


def block_reference(h: torch.Tensor, w: dict, model: ModelConfig) -> torch.Tensor:
    """One block, unsharded: ``h + attn(norm(h))``, then ``+ mlp(norm(.))``."""
    h = h + attention_reference(_norm(h), w["q"], w["k"], w["v"], w["o"], model.n_heads, model.n_kv_heads)
    return h + mlp_reference(_norm(h), w["gate"], w["up"], w["down"])


def stack_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig) -> torch.Tensor:
    for w in layers:
        x = block_reference(x, w, model)
    return x


def effective_flops_per_s(model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 5) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters
    x tokens`` (``plan.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of
    ``batch`` sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch
    overhead dominates, and that is what the toy's compute proxy should include."""
    x = stack_input(model, batch, seq)
    best_s = float("inf")
    with torch.no_grad():
        stack_reference(x, layers, model)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            stack_reference(x, layers, model)
            best_s = min(best_s, time.perf_counter() - start)
    return 2 * active_params_per_gpu(model, Layout(1, 1)) * batch * seq / best_s


TOY_SWEEP_BYTES = (256, 16384, 1 << 20, 4 << 20)  # latency-bound to bandwidth-bound, a 4-rank sweep in ~1 s


def measure_toy_cluster(ranks, model: ModelConfig, layers: list[dict], attempts: int = 3):
    """The planner's toy cluster for ``ranks``, measured now: its link fitted by
    ``cost_calibration.calibrate`` on the ranks, its arithmetic speed by ``effective_flops_per_s``.
    Returns ``(cluster, calibration)``. On a busy machine a short sweep can come out with times that do
    not grow with size (no bandwidth to fit): the sweep is then repeated, up to ``attempts`` times."""
    from .cost_calibration import calibrate  # numpy-based, only needed here
    from .plan import toy_cluster

    for attempt in range(attempts):
        try:
            cal = calibrate(ranks, sizes_bytes=TOY_SWEEP_BYTES, rounds=3, calls=2)
            break
        except ValueError:
            if attempt == attempts - 1:
                raise
    return toy_cluster(cal.link, flops_per_s=effective_flops_per_s(model, layers, batch=2, seq=6)), cal


# -- one block split tp ways -------------------------------------------------------------------------------
def _attention_partial(n, w, model, tp, r):
    """This rank's heads: Q, K, V column slices, local attention, the output projection's row slice.
    Returns a partial sum of the attention output. (b, s, d_model)"""
    batch, seq, _ = n.shape
    heads, kv, hd = model.n_heads // tp, model.n_kv_heads // tp, model.head_dim
    q = F.linear(n, shard_columns(w["q"], tp)[r]).view(batch, seq, heads, hd).transpose(1, 2)  # (b, H/tp, s, hd)
    k = F.linear(n, shard_columns(w["k"], tp)[r]).view(batch, seq, kv, hd).transpose(1, 2)  # (b, KV/tp, s, hd)
    v = F.linear(n, shard_columns(w["v"], tp)[r]).view(batch, seq, kv, hd).transpose(1, 2)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, H/tp, s, hd)
    return F.linear(o.transpose(1, 2).reshape(batch, seq, heads * hd), shard_rows(w["o"], tp)[r])


def _mlp_partial(n, w, tp, r):
    """Gate and up column slices, down row slice: a partial sum of the MLP output. (b, s, d_model)"""
    gate, up = F.linear(n, shard_columns(w["gate"], tp)[r]), F.linear(n, shard_columns(w["up"], tp)[r])
    return F.linear(F.silu(gate) * up, shard_rows(w["down"], tp)[r])


def tp_block(h: torch.Tensor, w: dict, model: ModelConfig, tp: int, r: int, all_reduce) -> torch.Tensor:
    """One block on tensor-parallel rank ``r`` of ``tp``: two all-reduces (Megatron's g after attention
    and after the MLP). ``all_reduce(t)`` sums ``t`` over the group."""
    h = h + all_reduce(_attention_partial(_norm(h), w, model, tp, r))
    return h + all_reduce(_mlp_partial(_norm(h), w, tp, r))


def simulate_tp_stack(x: torch.Tensor, layers: list[dict], model: ModelConfig, tp: int) -> torch.Tensor:
    """The tensor-parallel stack in one process: every rank's partial computed here and summed, layer by
    layer (a stand-in for the all-reduce). Equal to ``stack_reference`` within ``TOLERANCE``."""
    check_tensor_parallel(model, tp)
    h = x
    for w in layers:
        h = h + sum(_attention_partial(_norm(h), w, model, tp, r) for r in range(tp))
        h = h + sum(_mlp_partial(_norm(h), w, tp, r) for r in range(tp))
    return h


# -- the rank function -------------------------------------------------------------------------------------
_GROUPS: dict = {}  # (id(ctx), mesh) -> (tp group, pp group) of this rank: made once per warm pool


def _groups(ctx, mesh: Mesh):
    key = (id(ctx), mesh)
    if key not in _GROUPS:
        mine = {}
        for axis, groups, size in (("tp", mesh.tp_groups(), mesh.tp), ("pp", mesh.pp_groups(), mesh.pp)):
            if size == 1:
                continue  # nothing to talk about on an axis of one
            for ranks in groups:  # every rank makes every group, in the same order
                group = ctx.new_group(ranks, axis)
                if ctx.rank in ranks:
                    mine[axis] = group
        _GROUPS[key] = (mine.get("tp"), mine.get("pp"))
    return _GROUPS[key]


def combined_forward(ctx, mesh: Mesh, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                     n_microbatches: int = 2) -> dict:
    """Forward ``x`` (batch, seq, d_model) through the stack on a ``pp x dp x tp`` mesh.

    Replica ``d`` takes its share of the batch and cuts it into ``n_microbatches``. Stage ``s`` holds
    layers ``split_layers(L, pp)[s]``; each microbatch is received from the same tp rank of stage
    ``s - 1``, run through the stage's layers with two tp all-reduces per layer, and sent on to the
    same tp rank of stage ``s + 1``. The last stage returns the output.
    """
    mesh.check_world(ctx.world_size)
    tp_group, pp_group = _groups(ctx, mesh)
    stage, replica, t = mesh.coords(ctx.rank)
    mine = [layers[i] for i in split_layers(model.n_layers, mesh.pp)[stage]]
    part = x.tensor_split(mesh.dp)[replica]  # (batch / dp, seq, d_model)
    outputs = []

    def all_reduce(tensor):
        return ctx.comm.all_reduce(tensor.contiguous(), group=tp_group) if mesh.tp > 1 else tensor

    start_s = time.perf_counter()
    with torch.no_grad():
        for i, mb in enumerate(part.tensor_split(n_microbatches)):  # (rows, seq, d_model)
            h = mb.clone().to(ctx.device)
            if stage > 0:
                ctx.comm.recv(h, mesh.rank(stage - 1, replica, t), group=pp_group)
            with ctx.timeline.span(f"F{i}", kind="compute", stage=stage):
                for w in mine:
                    h = tp_block(h, w, model, mesh.tp, t, all_reduce)
            if stage < mesh.pp - 1:
                ctx.comm.send(h, mesh.rank(stage + 1, replica, t), group=pp_group)
            else:
                outputs.append(h)
    end_s = time.perf_counter()
    return {"rank": ctx.rank, "stage": stage, "replica": replica, "tp_rank": t,
            "output": torch.cat(outputs) if outputs else None, "start_s": start_s, "end_s": end_s}


# -- the driver ----------------------------------------------------------------------------------------------
def _axis_op(a: AxisTraffic) -> tuple[str, str]:
    return a.axis, a.op


def traffic_by_axis(records) -> list[AxisTraffic]:
    """The comm log summed per (mesh axis, op), all ranks together."""
    sums: dict[tuple[str, str], list[int]] = {}
    for r in records:
        row = sums.setdefault((r.group, r.op), [0, 0])
        row[0] += 1
        row[1] += r.size_bytes
    return sorted((AxisTraffic(axis, op, n, b) for (axis, op), (n, b) in sums.items()), key=_axis_op)


@dataclass(frozen=True)
class CombinedRun:
    mesh: Mesh
    output: torch.Tensor  # (batch, seq, d_model): the last stage's output, replicas in order
    last_stage_agree: bool  # every tp rank of every last stage returned the same tensor
    measured: tuple[AxisTraffic, ...]
    predicted: tuple[AxisTraffic, ...]
    comm_s_by_axis: dict  # axis -> seconds spent in its calls, summed over ranks
    wall_s: float  # first rank's start to last rank's end
    spans: tuple = ()  # every rank's timeline: compute per microbatch, and each call


def run_combined(ranks, mesh: Mesh, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 n_microbatches: int = 2) -> CombinedRun:
    """Check the inputs here, run ``combined_forward`` on ``ranks``, gather outputs and the comm log."""
    mesh.check_world(ranks.world_size)
    check_inputs(mesh, model, layers, x, n_microbatches)
    res = ranks.run(combined_forward, mesh, model, layers, x, n_microbatches)
    last = [r for r in res if r["stage"] == mesh.pp - 1]
    by_replica = [[r["output"] for r in last if r["replica"] == d] for d in range(mesh.dp)]
    agree = all(torch.equal(o, outs[0]) for outs in by_replica for o in outs)
    comm_s: dict[str, float] = {}
    for rec in ranks.last_comm:
        comm_s[rec.group] = comm_s.get(rec.group, 0.0) + rec.duration_s
    predicted = forward_traffic(model, mesh.layout, x.shape[0] // mesh.dp, x.shape[1], n_microbatches)
    return CombinedRun(mesh, torch.cat([outs[0] for outs in by_replica]), agree,
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
