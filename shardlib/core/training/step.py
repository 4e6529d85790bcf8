"""One training step on a rank over ``dp x pp x cp x tp`` (and ``ep``): the course's mechanisms, composed.

The mesh is ``Layout``'s: ``ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)``, Megatron's
``tp-cp-dp-pp`` order, tp innermost, pp outermost; each axis is a ``ctx.group`` the mechanisms run on.
Inside a stage: tensor parallelism with sequence parallelism in every block (Korthikanti et al. 2022), the
embedding and LM head split over the vocabulary with vocabulary-parallel cross-entropy (Megatron's); tokens
split over cp in the zigzag placement, attention over the cp ring (``core.context_parallel.ring``); with experts,
each MLP the dropless MoE layer over ``ep`` ranks of the stage (``moe_block``). Across stages: the pipeline
engine (``core.pipeline.engine``) runs the schedule ``config.schedule`` on this rank's ``StageModel`` s, one per
model chunk. Then data parallelism over the ranks that hold the same weights: ``core.data_parallel.buckets``
(``BucketedReplica``: DDP, ZeRO-1, ZeRO-2; with experts one for the tp-split weights over ``dp x cp``, one
for the routers over the stage, one for the experts over their holders) or ``data_parallel.zero3``
(``ShardedUnits``; pp = 1). The residual stream between ops is ``(b, s/(cp tp), d)``. Measurement attaches
through ``probe`` (the engine's spans) and ``on_saved`` (sees what autograd saves).
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from shardlib.core.adamw import adamw
from shardlib.core.context_parallel.placement import positions_of_rank
from shardlib.core.context_parallel.ring import ring_attention
from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.core.experts.balance import bias_update
from shardlib.core.experts.placement import layout_expert_groups
from shardlib.core.model import rms_norm
from shardlib.core.pipeline.engine import Stage, run_stage
from shardlib.core.pipeline.messages import Links
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.probe import NO_PROBE
from shardlib.core.tensor_parallel.blocks import ParallelAttention, ParallelMLP
from shardlib.core.tensor_parallel.layers import ColumnParallelLinear, TPGroup
from shardlib.core.tensor_parallel.sequence_parallel import gather_seq, scatter_seq
from shardlib.core.tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from shardlib.core.training.config import layer_of
from shardlib.core.training.moe_block import MoEMLP

_DP_CP_GROUPS: dict = {}  # (world size, layout) -> this rank's dp x cp group, made once per warm worker


def rank_groups(ctx, layout):
    """This rank's ``TPGroup``, cp ring, pipeline and ``dp x cp`` group (each a ``ctx.group``)."""
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)
    me = layout.position(ctx.rank)

    def line(axis):
        return next(g for g in getattr(layout, f"{axis}_groups")() if ctx.rank in g)
    ring = ctx.group(line("cp"), mesh.get_group("cp")) if layout.cp > 1 else None
    pipe = ctx.group(line("pp"), mesh.get_group("pp"))
    if layout.cp == 1:
        dp_cp = ctx.group(line("dp"), mesh.get_group("dp"))
    else:  # the ranks holding the same weights: every replica and every place in the ring
        key = (ctx.world_size, layout.mesh_shape)
        if key not in _DP_CP_GROUPS:
            made = [ctx.new_group(g, "dp-cp") for g in layout.dp_cp_groups()]  # every rank makes every group
            _DP_CP_GROUPS[key] = made[[i for i, g in enumerate(layout.dp_cp_groups()) if ctx.rank in g][0]]
        dp_cp = ctx.group(line("dp_cp"), _DP_CP_GROUPS[key])
    return me, TPGroup.of_mesh(ctx, mesh, "tp"), ring, pipe, dp_cp


class Block(nn.Module):
    """One toy block: heads split over tp, tokens over cp (ring attention), SP outside the pairs. With experts
    (``moe``, a ``moe_block.MoEMLP``) the MLP is the MoE layer on this rank's sequence-parallel tokens."""

    def __init__(self, w: dict, model, tpg: TPGroup, ring, moe: MoEMLP | None = None) -> None:
        super().__init__()
        self.tpg, self.attention = tpg, ParallelAttention(w, model, tpg)
        if moe is None:
            self.mlp = ParallelMLP(w, tpg)
        self.moe = moe
        # q (b, H/tp, s/cp, hd), k, v (b, KV/tp, s/cp, hd) attend over the whole sequence round the ring
        self.ring = None if ring is None else partial(ring_attention, ring, causal=True, placement="zigzag")

    def forward(self, h):  # (b, s/(cp tp), d)
        attention = self.attention.local(gather_seq(rms_norm(h), self.tpg), attend=self.ring)  # (b, s/cp, d): a share
        h = h + scatter_seq(attention, self.tpg)
        if self.moe is not None:  # each rank routes its own tokens as rows: no tp collective
            return h + self.moe(rms_norm(h))
        return h + scatter_seq(self.mlp.local(gather_seq(rms_norm(h), self.tpg)), self.tpg)


class Embedding(nn.Module):
    def __init__(self, weight, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg, self.vocab = tpg, VocabParallelEmbedding(weight, tpg)

    def forward(self, tokens):  # (b, s/cp) -> (b, s/(cp tp), d)
        return scatter_seq(self.vocab.local(tokens), self.tpg)


class Head(nn.Module):
    def __init__(self, weight, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg, self.out = tpg, ColumnParallelLinear(weight, None, tpg)

    def forward(self, h, targets):  # h (b, s/(cp tp), d), targets (b, s/cp) -> per-token loss (b, s/cp)
        logits = self.out.local(gather_seq(rms_norm(h), self.tpg))  # (b, s/cp, V/tp)
        return vocab_parallel_cross_entropy(logits, targets, self.tpg)


class StageModel(nn.Module):
    """One model chunk: its layers (named ``layer{i}`` by their index in the whole model), with the
    embedding on the first virtual stage and the head and loss on the last. ZeRO-3 gathers each child as
    one unit. ``forward(tokens or h, targets)``: the hidden state on, or the per-token loss at the end."""

    def __init__(self, weights: dict, config, layers: range, first: bool, last: bool, tpg, ring, moe=None) -> None:
        super().__init__()
        self.layers = list(layers)
        if first:
            self.embed = Embedding(weights["embed"], tpg)
        for i in self.layers:
            w = layer_of(weights, i)
            mlp = MoEMLP(moe[0], w, config.moe, moe[1], tpg, moe[2]) if config.is_moe else None
            self.add_module(f"layer{i}", Block(w, config.model, tpg, ring, mlp))
        if last:
            self.head = Head(weights["head"], tpg)
        self.first, self.last = first, last

    def forward(self, x, targets=None):  # x (b, s/cp) tokens or (b, s/(cp tp), d); targets (b, s/cp)
        h = self.embed(x) if self.first else x
        for i in self.layers:
            h = getattr(self, f"layer{i}")(h)
        return self.head(h, targets) if self.last else h


class TrainingStep:
    """This rank's model chunks and the step it runs: ``run(tokens)`` trains on this replica's rows.

    The pipeline engine runs ``config.schedule`` on the chunks; the last virtual stage's backward starts
    from the loss, ``d(sum of token losses / tokens per step)``; data parallelism over ``dp x cp`` is
    ``BucketedReplica`` (DDP, ZeRO-1, ZeRO-2) or ``ShardedUnits`` (ZeRO-3), with AdamW on what it owns."""

    def __init__(self, ctx, layout, config, weights: dict, stage_layers: tuple[range, ...], probe=NO_PROBE,
                 on_saved=None) -> None:
        self.ctx, self.layout, self.config, self.probe, self.on_saved = ctx, layout, config, probe, on_saved
        self.me, self.tpg, self.ring, self.pipe, self.dp_cp = rank_groups(ctx, layout)
        self.schedule = make_schedule(config.schedule, layout.pp, config.m, n_chunks=config.chunks)
        ends = self.schedule.n_virtual_stages - 1
        virtual = [self.schedule.virtual_stage_of(self.me.stage, c) for c in range(self.schedule.n_chunks)]
        moe = None
        if config.is_moe:
            self.experts_groups = layout_expert_groups(ctx, layout)
            moe = (ctx, self.experts_groups, config.aux_loss_coef / (layout.dp * config.m))
        self.chunks = [StageModel(weights, config, stage_layers[v], v == 0, v == ends, self.tpg, self.ring, moe)
                       for v in virtual]  # chunk c is virtual stage virtual[c]
        self.model = self.chunks[0] if len(self.chunks) == 1 else nn.ModuleList(self.chunks)
        placement = "zigzag" if layout.cp > 1 else "contiguous"
        self.positions = positions_of_rank(self.me.cp_rank, layout.cp, config.seq, placement)  # my tokens
        self.tokens_per_step = config.global_tokens(layout.dp)
        self.replicas = ()
        if layout.dp_strategy == "zero3":
            self.dp = ShardedUnits(self.dp_cp, self.model, prefetch=False, overlap=False, probe=probe)
        elif config.is_moe:  # three gradient groups: tp-split weights over dp, routers over the stage, experts
            self.replicas = tuple(BucketedReplica(group, part, layout.dp_strategy, None, overlap=False,
                                                  microbatches=config.m)
                                  for group, part in zip(self.moe_groups(), self.moe_parts()))
            self.dp = self.replicas[0]
        else:
            self.dp = BucketedReplica(self.dp_cp, self.model, layout.dp_strategy, None, overlap=False,
                                      microbatches=config.m)  # one bucket; AdamW's shard a view of it
        owned = [p for r in self.replicas for p in r.owned] if self.replicas else self.dp.owned
        self.optimizer = adamw(owned, config)
        zero3 = layout.dp_strategy == "zero3"  # its saved-tensor hooks keep notes, not gathered weights
        self.pack, self.unpack = (self.dp.pack, self.dp.unpack) if zero3 else (lambda t: t, lambda t: t)

    def moe_parts(self) -> tuple[nn.Module, nn.Module, nn.Module]:
        """The model's weights in its three gradient groups: tp-split (attention, embedding, head), the
        routers, the experts. Each a container of the modules that own them (the buckets replace those
        modules' parameters by views, as for the whole model)."""
        dense, routers, experts = nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        for chunk in self.chunks:
            for name in ("embed", "head"):
                if hasattr(chunk, name):
                    dense.append(getattr(chunk, name))
            for i in chunk.layers:
                block = getattr(chunk, f"layer{i}")
                dense.append(block.attention)
                routers.append(block.moe.router)
                experts.append(block.moe.experts)
        return dense, routers, experts

    def moe_groups(self):
        """The groups the three sum over: ``dp`` (as a dense step's), the stage's ranks, the expert-data-
        parallel ranks (``RankGroup`` s, named "dp", "stage" and "edp" in the comm log)."""
        lay, rank = self.layout, self.ctx.rank
        stage = next(g for g in lay.stage_groups() if rank in g)
        edp = next(g for g in lay.expert_dp_groups() if rank in g)
        return (self.dp_cp, self.ctx.group(stage, self.experts_groups.stage),
                self.ctx.group(edp, self.experts_groups.edp))

    def moe_layers(self) -> list[MoEMLP]:
        return [getattr(chunk, f"layer{i}").moe for chunk in self.chunks for i in chunk.layers]

    def move_biases(self) -> None:
        """DeepSeek-V3's bias update after the step: each layer's counts summed over the stage's ranks
        (one all-reduce for all of this rank's layers), then ``bias_update``."""
        layers = self.moe_layers()
        counts = torch.stack([layer.step_counts for layer in layers])  # (layers, E): the step's token-slots
        for layer in layers:
            layer.step_counts = torch.zeros_like(layer.step_counts)
        if layers[0].bias is None:
            return
        self.moe_groups()[1].comm.all_reduce(counts)  # summed in place over the stage's ranks
        for layer, c in zip(layers, counts):
            layer.bias = bias_update(layer.bias, c, self.config.bias_rate)

    def chunk(self, c: int):
        """Chunk ``c`` as the engine calls it: its forward under autograd's saved-tensor hooks (ZeRO-3's
        notes for gathered weights; ``on_saved()`` shown every tensor that is really kept)."""
        def forward(h, targets=None):
            see = self.on_saved() if self.on_saved else None

            def pack(t):
                out = self.pack(t)
                if see is not None and out is t:
                    see(t)
                return out
            with torch.autograd.graph.saved_tensors_hooks(pack, self.unpack):
                return self.chunks[c](h, targets)
        return forward

    def run(self, tokens: torch.Tensor) -> float:
        """One step on this replica's ``(m x microbatch, seq + 1)`` tokens; returns the sum of the token
        losses this rank computed (the last virtual stage's rank; 0 elsewhere), over the global batch's
        token count."""
        c, mb, pos, t = self.config, self.config.microbatch, self.positions, self.tokens_per_step
        x, y = tokens[:, :-1][:, pos], tokens[:, 1:][:, pos]  # (m mb, s/cp): my place in the ring
        shape = (mb, c.seq // (self.layout.cp * self.layout.tp), c.d_model)  # every message: (b, s/(cp tp), d)
        links = Links(self.pipe.comm, self.schedule, self.me.stage, lambda a: shape, self.ctx.device, c.torch_dtype)
        d_loss = torch.full(y[:mb].shape, 1 / t, dtype=c.torch_dtype, device=self.ctx.device)  # d(sum / t)
        stage = Stage(self.schedule, self.me.stage, [self.chunk(k) for k in range(len(self.chunks))],
                      x.split(mb), links, [d_loss] * c.m, y.split(mb))
        replicas = self.replicas or (self.dp,)
        for r in replicas:
            r.start_step()
        run_stage(stage, self.probe)
        with self.probe.span("optimizer", op="optimizer"):
            for r in replicas:
                r.finish_backward()  # the last bucket's sum over its group (dp x cp, the stage, the experts')
            self.optimizer.step()
            for r in replicas:
                r.after_step()  # ZeRO-1/2: every rank's updated shard, gathered
        if self.config.is_moe:
            self.move_biases()
        return sum(float(stage.outputs[k].sum()) / t for k in sorted(stage.outputs))
