"""One training step on a rank over ``dp x pp x cp x tp``: the course's mechanisms, composed.

The mesh is ``Layout``'s: ``ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)``, Megatron's
``tp-cp-dp-pp`` order, tp innermost (its ranks consecutive, inside a node), pp outermost; each axis is a
``ctx.group`` the mechanisms run on. Inside a stage: tensor parallelism with sequence parallelism in every
block (Korthikanti et al. 2022), the embedding and LM head split over the vocabulary with
vocabulary-parallel cross-entropy (Megatron's); tokens split over cp in the zigzag placement, attention over
the cp ring (``context_parallel.ring``). Across stages: the pipeline engine (``pipeline.engine``) runs the
schedule ``config.schedule`` of the registry on this rank's ``StageModel`` s, one per model chunk (the
embedding on the first virtual stage, the final norm, head and per-token loss on the last). Then data
parallelism over the ``dp x cp`` ranks that hold the same weights: ``data_parallel.buckets``
(``BucketedReplica``: DDP, ZeRO-1, ZeRO-2, the gradients of the m microbatches accumulated in its buckets)
or ``data_parallel.zero3`` (``ShardedUnits``: layers gathered before use; pp = 1). The residual stream
between ops is ``(b, s/(cp tp), d)``. Measurement attaches through ``probe`` (the engine's spans) and
``on_saved`` (sees what autograd saves).
"""

from __future__ import annotations

import torch
from torch import nn

from ..context_parallel.placement import positions_of_rank
from ..context_parallel.ring import ring_attention
from ..data_parallel.buckets import BucketedReplica
from ..data_parallel.zero3 import ShardedUnits
from ..pipeline.engine import Stage, run_stage
from ..pipeline.messages import Links
from ..pipeline.orders import make_schedule
from ..runtime.measure import NO_PROBE
from ..tensor_parallel.blocks import ParallelAttention, ParallelMLP
from ..tensor_parallel.layers import ColumnParallelLinear, TPGroup
from ..tensor_parallel.sequence_parallel import GatherFromSequence, ScatterToSequence
from ..tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from ..toy import rms_norm, split_heads
from .reference import adamw, layer_of


def gather_seq(x, tpg):  # (b, s/(cp tp), d) -> (b, s/cp, d)
    return x if tpg.tp == 1 else GatherFromSequence.apply(x, tpg)


def scatter_seq(x, tpg):  # (b, s/cp, d) partial -> (b, s/(cp tp), d) summed
    return x if tpg.tp == 1 else ScatterToSequence.apply(x, tpg)


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
    """One toy block: heads split over tp, tokens over cp (ring attention), SP outside the pairs."""

    def __init__(self, w: dict, model, tpg: TPGroup, ring) -> None:
        super().__init__()
        self.tpg, self.ring = tpg, ring
        self.attention, self.mlp = ParallelAttention(w, model, tpg), ParallelMLP(w, tpg)

    def attend(self, x):  # x (b, s/cp, d): this ring place's tokens, whole
        a = self.attention
        if self.ring is None:
            return a.local(x)
        q = split_heads(a.q.local(x), a.heads)  # (b, H/tp, s/cp, hd)
        k, v = split_heads(a.k.local(x), a.kv_heads), split_heads(a.v.local(x), a.kv_heads)
        o = ring_attention(self.ring, q, k, v, causal=True, placement="zigzag")  # (b, H/tp, s/cp, hd)
        return a.o.partial(o.transpose(1, 2).flatten(2))  # (b, s/cp, d): this tp rank's share

    def forward(self, h):  # (b, s/(cp tp), d)
        h = h + scatter_seq(self.attend(gather_seq(rms_norm(h), self.tpg)), self.tpg)
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

    def __init__(self, weights: dict, config, layers: range, first: bool, last: bool, tpg, ring) -> None:
        super().__init__()
        self.layers = list(layers)
        if first:
            self.embed = Embedding(weights["embed"], tpg)
        for i in self.layers:
            self.add_module(f"layer{i}", Block(layer_of(weights, i), config.model, tpg, ring))
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
        self.chunks = [StageModel(weights, config, stage_layers[v], v == 0, v == ends, self.tpg, self.ring)
                       for v in virtual]  # chunk c is virtual stage virtual[c]
        self.model = self.chunks[0] if len(self.chunks) == 1 else nn.ModuleList(self.chunks)
        placement = "zigzag" if layout.cp > 1 else "contiguous"
        self.positions = positions_of_rank(self.me.cp_rank, layout.cp, config.seq, placement)  # my tokens
        self.tokens_per_step = config.global_tokens(layout.dp)
        if layout.dp_strategy == "zero3":
            self.dp = ShardedUnits(self.dp_cp, self.model, prefetch=False, overlap=False, probe=probe)
        else:
            self.dp = BucketedReplica(self.dp_cp, self.model, layout.dp_strategy, None, overlap=False,
                                      microbatches=config.m)  # one bucket; AdamW's shard a view of it
        self.optimizer = adamw(self.dp.owned, config)
        zero3 = layout.dp_strategy == "zero3"  # its saved-tensor hooks keep notes, not gathered weights
        self.pack, self.unpack = (self.dp.pack, self.dp.unpack) if zero3 else (lambda t: t, lambda t: t)

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
        self.dp.start_step()
        run_stage(stage, self.probe)
        with self.probe.span("optimizer", op="optimizer"):
            self.dp.finish_backward()  # the last bucket's sum over dp x cp
            self.optimizer.step()
            self.dp.after_step()  # ZeRO-1/2: every rank's updated shard, gathered
        return sum(float(stage.outputs[k].sum()) / t for k in sorted(stage.outputs))
