"""Tensor parallelism inside a "node", pipeline stages across "nodes": the combined forward on a rank.

A ``plan.Layout`` numbers ranks ``(stage * dp + replica) * tp + tp_rank`` and gives a torch
``DeviceMesh`` with axes ``("pp", "dp", "tp")``. The ranks of one stage split every block of its layers
(``core.tensor_parallel.blocks.ParallelBlock``, Megatron-LM: Shoeybi et al. 2019, two all-reduces per block
on the tp axis); activations cross from stage to stage by point-to-point sends on the pp axis (GPipe's
forward: Huang et al. 2019). A model with experts replaces each MLP by the dropless MoE layer over ``ep``
ranks of the stage (``moe_mlp``). ``run_round`` runs a batch through once (one step), or keeps microbatches
going round the stages step after step, the last stage handing each output back to the first as its next
input (steady-state decode, ``predict.serving.decode``'s model). It sends with ``isend`` and receives in
place rather than through the pipeline engine's message threads (``core.pipeline.messages``): in
steady-state decode a thread hand-off per microbatch costs as much as the step's compute on a small model.
Measurement attaches through ``probe`` (``core.probe.Probe``). Each rank receives the full weights and keeps
its slices.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.experts.dispatch import LocalExperts, layer_experts
from shardlib.core.experts.placement import ExpertGroups, layout_expert_groups
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.mesh import Layout, check_mesh
from shardlib.core.model import rms_norm
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.probe import NO_PROBE, Probe
from shardlib.core.tensor_parallel.blocks import ParallelBlock, moe_on_tp_tokens
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.toy import ATTENTION_WEIGHTS


@dataclass(frozen=True)
class RankExperts:
    """One MoE layer on this rank: the router (whole on every rank) and the experts it holds."""

    router: torch.Tensor  # (n_experts, d_model)
    local: LocalExperts  # (n_experts / ep, ...) gate, up, down: the block at this rank's place of its ep group


@dataclass(frozen=True)
class RankStage:
    """This rank's place on the mesh, its pipeline group, and its stage's blocks split over its tp group
    (with experts: each block's attention, and its MoE layer in ``experts``)."""

    stage: int
    replica: int
    tp_rank: int
    pp_group: object
    blocks: tuple[ParallelBlock, ...]
    experts: tuple[RankExperts, ...] = ()  # one per block of an MoE model, else empty
    tp_group: TPGroup | None = None
    groups: ExpertGroups | None = None
    moe: object = None  # the layer's MoEConfig


def build_stage(ctx, layout: Layout, model: ModelConfig, layers: list[dict]) -> RankStage:
    """The mesh of ``layout`` (made once per pool), this rank's coordinates and its stage's blocks."""
    check_mesh(layout, ctx.world_size, "ranks")
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)  # axes ("pp", "dp", "tp"), tp innermost
    stage, replica, tp_rank = layout.coords(ctx.rank)
    tp_group = TPGroup.of_mesh(ctx, mesh, "tp")  # the ranks of this stage and replica: one "node"
    mine = split_layers(model.n_layers, layout.pp)[stage]  # this stage's layer numbers
    if not model.is_moe:
        blocks = tuple(ParallelBlock(layers[i], model, tp_group).to(ctx.device) for i in mine)
        return RankStage(stage, replica, tp_rank, mesh.get_group("pp"), blocks)
    groups = layout_expert_groups(ctx, layout)  # every rank makes every group, so before any early return
    cfg = MoEConfig.from_model(model)
    n_local = cfg.experts_per_rank(layout.ep)
    block = slice(groups.place * n_local, (groups.place + 1) * n_local)  # this rank's experts
    blocks = tuple(ParallelBlock({k: layers[i][k] for k in ATTENTION_WEIGHTS}, model, tp_group).to(ctx.device)
                   for i in mine)  # the attention only
    experts = tuple(RankExperts(layers[i]["router"].to(ctx.device),
                                LocalExperts(*(t.to(ctx.device) for t in layer_experts(layers[i], block))))
                    for i in mine)
    return RankStage(stage, replica, tp_rank, mesh.get_group("pp"), blocks, experts, tp_group, groups, cfg)


def moe_mlp(ctx, me: RankStage, part: RankExperts, n: torch.Tensor) -> torch.Tensor:
    """The MoE layer on ``n`` ``(rows, seq, d_model)``, normed and whole on every tp rank (the attention's
    all-reduce left it so): this tp rank's ``1/tp`` of the tokens through the experts package's dropless layer
    (``core.experts.dispatch.moe_layer``), dispatched to and combined from the ``ep`` ranks of the stage holding
    their experts (``Layout.ep_groups``: consecutive ranks, across tp and the replicas), then gathered whole
    on the tp axis. ``ep`` over the replicas with ``tp = 1`` is wide EP with data-parallel attention: each
    rank its own sequences, the attention whole on every rank, the experts over all of them."""
    tokens = n.reshape(-1, n.shape[-1])  # (rows * seq, d_model)
    ep = me.groups.ep  # None (ep = 1): every expert here; else three all-to-alls on the ep axis
    y = moe_on_tp_tokens(tokens, part.router, part.local, me.moe, me.tp_group, ctx=None if ep is None else ctx,
                         group=ep, place=me.groups.place)  # (rows * seq, d_model), gathered whole on the tp axis
    return y.view(n.shape)


def run_blocks(ctx, me: RankStage, h: torch.Tensor) -> torch.Tensor:
    """This stage's blocks on ``h`` ``(rows, seq, d_model)``: two all-reduces on the tp axis per dense block;
    per MoE block one (the attention's), the ep axis's all-to-alls and one all-gather on the tp axis."""
    if not me.experts:
        for block in me.blocks:
            h = block(h)
        return h
    for block, part in zip(me.blocks, me.experts):
        h = block(h)  # h + attention(norm h)
        h = h + moe_mlp(ctx, me, part, rms_norm(h))
    return h


def run_round(ctx, layout: Layout, me: RankStage, x: torch.Tensor, n_microbatches: int, steps: int,
              probe: Probe = NO_PROBE) -> list[torch.Tensor] | None:
    """``steps`` passes of ``x`` (batch, seq, d_model) through the stages, microbatch after microbatch.

    A stage receives each microbatch from the same tp rank of the stage before (the first stage, after step
    0, from the last: its outputs are the next step's inputs), runs its blocks and sends the result on
    without waiting (``isend``), so it goes straight on to its next microbatch. On the last stage, every
    output, step by step; elsewhere ``None``."""
    s, d, t, pp = me.stage, me.replica, me.tp_rank, layout.pp
    first, last = s == 0, s == pp - 1
    src, dst = layout.rank((s - 1) % pp, d, t), layout.rank((s + 1) % pp, d, t)  # round the ring of stages
    buffers = [mb.clone().to(ctx.device) for mb in x.tensor_split(layout.dp)[d].tensor_split(n_microbatches)]
    outputs, sends = [], []
    with torch.no_grad():
        for step in range(steps):
            for i, h in enumerate(buffers):  # h: (rows, seq, d_model), this microbatch's input this step
                if pp > 1 and not (first and step == 0):
                    ctx.comm.recv(h, src, group=me.pp_group)
                with probe.span(f"F{i}" if steps == 1 else f"T{step}.{i}", kind="compute", stage=s):
                    h = run_blocks(ctx, me, h)  # two all-reduces on the tp axis per dense block
                if last:
                    outputs.append(h)
                if pp == 1:
                    buffers[i] = h  # the next step's input, here on this rank
                elif not (last and step == steps - 1):
                    sends.append(ctx.comm.isend(h, dst, group=me.pp_group))
        for pending in sends:
            pending.wait()
    return outputs if last else None
