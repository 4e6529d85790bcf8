"""One training step on a rank over ``dp x pp x cp x tp``: the model's part this rank holds, and the step.

The mesh is ``Layout``'s: ``ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)``, Megatron's
``tp-cp-dp-pp`` order, tp innermost (its ranks consecutive, inside a node), pp outermost. Inside a stage:
tensor parallelism with sequence parallelism in every block (Korthikanti et al. 2022), the embedding and
LM head split over the vocabulary with vocabulary-parallel cross-entropy (Megatron's); tokens split over
cp in the zigzag placement, attention over the cp ring (``context_parallel.ring``). Across stages: 1F1B
(``pipeline.schedules``), messages on helper threads (``pipeline.messages``); the first stage holds the
embedding, the last the final norm, head and loss. Then data parallelism over the ``dp x cp`` ranks that
hold the same weights: DDP (all-reduce), ZeRO-1 (reduce-scatter once, AdamW on a shard, all-gather),
ZeRO-2 (reduce-scatter after every microbatch) or ZeRO-3 (``data_parallel.zero3``, layers gathered
before use; pp = 1). The residual stream between ops is ``(b, s/(cp tp), d)``. Measurement attaches
through ``probe`` (spans ``F``/``B`` per microbatch) and ``on_saved`` (sees what autograd saves).
"""

from __future__ import annotations

import torch
from torch import nn

from ..context_parallel.placement import positions_of_rank
from ..context_parallel.ring import ring_attention
from ..data_parallel.flat import padded
from ..data_parallel.zero3 import ShardedUnits
from ..pipeline.messages import Links
from ..pipeline.orders import make_schedule
from ..runtime.measure import NO_PROBE
from ..tensor_parallel.blocks import ParallelAttention, ParallelMLP
from ..tensor_parallel.layers import ColumnParallelLinear, TPGroup
from ..tensor_parallel.sequence_parallel import GatherFromSequence, ScatterToSequence
from ..toy import rms_norm, split_heads
from .reference import adamw, layer_of
from .vocab_standin import VocabParallelEmbedding, vocab_parallel_cross_entropy


def gather_seq(x, tpg):  # (b, s/(cp tp), d) -> (b, s/cp, d)
    return x if tpg.tp == 1 else GatherFromSequence.apply(x, tpg)


def scatter_seq(x, tpg):  # (b, s/cp, d) partial -> (b, s/(cp tp), d) summed
    return x if tpg.tp == 1 else ScatterToSequence.apply(x, tpg)


class GroupView:
    """A process group seen as a whole job: ``rank`` (place in ``ranks``), ``world_size``, and ``comm``
    whose calls take places, not global ranks, on ``group``. Ring attention and ZeRO-3 run on it as is."""

    def __init__(self, ctx, ranks: list[int], group) -> None:
        self.ctx, self.ranks, self.group, self.device = ctx, ranks, group, ctx.device
        self.rank, self.world_size, self.comm = ranks.index(ctx.rank), len(ranks), self

    def isend(self, t, place):
        return self.ctx.comm.isend(t, self.ranks[place], group=self.group)

    def irecv(self, t, place):
        return self.ctx.comm.irecv(t, self.ranks[place], group=self.group)

    def send(self, t, place):
        return self.ctx.comm.send(t, self.ranks[place], group=self.group)

    def recv(self, t, place):
        return self.ctx.comm.recv(t, self.ranks[place], group=self.group)

    def all_gather(self, t, async_op=False):
        return self.ctx.comm.all_gather(t, group=self.group, async_op=async_op)

    def reduce_scatter(self, t, async_op=False):
        return self.ctx.comm.reduce_scatter(t, group=self.group, async_op=async_op)

    def all_reduce(self, t):
        return self.ctx.comm.all_reduce(t, group=self.group)


_DP_CP_GROUPS: dict = {}  # (world size, layout) -> this rank's dp x cp group, made once per warm worker


def rank_groups(ctx, layout):
    """This rank's ``TPGroup``, cp ring, pipeline and ``dp x cp`` group (each a ``GroupView``)."""
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)
    me = layout.position(ctx.rank)

    def line(axis):
        return next(g for g in getattr(layout, f"{axis}_groups")() if ctx.rank in g)
    ring = GroupView(ctx, line("cp"), mesh.get_group("cp")) if layout.cp > 1 else None
    pipe = GroupView(ctx, line("pp"), mesh.get_group("pp"))
    if layout.cp == 1:
        dp_cp = GroupView(ctx, line("dp"), mesh.get_group("dp"))
    else:  # the ranks holding the same weights: every replica and every place in the ring
        key = (ctx.world_size, layout.mesh_shape)
        if key not in _DP_CP_GROUPS:
            made = [ctx.new_group(g, "dp-cp") for g in layout.dp_cp_groups()]  # every rank makes every group
            _DP_CP_GROUPS[key] = made[[i for i, g in enumerate(layout.dp_cp_groups()) if ctx.rank in g][0]]
        dp_cp = GroupView(ctx, line("dp_cp"), _DP_CP_GROUPS[key])
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
    """This stage's layers (named ``layer{i}`` by their index in the whole model), with the embedding
    on the first stage and the head on the last. ZeRO-3 gathers each child as one unit."""

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

    def forward(self, x, targets):
        h = self.embed(x) if self.first else x
        for i in self.layers:
            h = getattr(self, f"layer{i}")(h)
        return self.head(h, targets) if self.last else h


class DataParallel:
    """DDP or ZeRO-1/2 over the ``dp x cp`` group ``g``: gradients summed, AdamW, weights the same."""

    def __init__(self, model: nn.Module, strategy: str, g: GroupView, config) -> None:
        self.params, self.strategy, self.g = list(model.parameters()), strategy, g
        self.numel = sum(p.numel() for p in self.params)
        self.shard = padded(self.numel, g.world_size) // g.world_size
        if strategy == "ddp":
            self.owned = self.params
        else:  # ZeRO-1/2: this rank's slice of the flat weights, the only ones its optimizer updates
            start = g.rank * self.shard
            self.owned = [nn.Parameter(self.flat([p.detach() for p in self.params])[start:start + self.shard].clone())]
        self.optimizer = adamw(self.owned, config)

    def flat(self, tensors):  # (padded numel,): the tensors end to end, zeros after
        out = torch.cat([t.flatten() for t in tensors])
        return torch.cat([out, out.new_zeros(self.shard * self.g.world_size - self.numel)])

    pack = unpack = staticmethod(lambda t: t)

    def reduce_scatter(self):  # the gradients' sum over dp x cp, this rank's shard of it, added up
        grads = self.flat([p.grad for p in self.params])
        mine = grads if self.g.world_size == 1 else self.g.reduce_scatter(grads)  # (padded / n,)
        shard = self.owned[0]
        shard.grad = mine if shard.grad is None else shard.grad + mine

    def after_microbatch(self):
        if self.strategy == "zero2":  # reduced after every microbatch: only the shard's gradient is kept
            self.reduce_scatter()
            for p in self.params:
                p.grad = None

    def step(self):
        if self.strategy == "ddp":
            if self.g.world_size > 1:
                total = self.g.all_reduce(self.flat([p.grad for p in self.params]))  # one bucket
                at = 0
                for p in self.params:
                    p.grad.copy_(total[at:at + p.numel()].view_as(p))
                    at += p.numel()
            self.optimizer.step()
            return
        if self.strategy == "zero1":
            self.reduce_scatter()
        self.optimizer.step()
        full = self.owned[0].detach() if self.g.world_size == 1 else self.g.all_gather(self.owned[0].detach())
        at = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(full[at:at + p.numel()].view_as(p))
                at += p.numel()

    def zero_grad(self):
        for p in self.params + self.owned:
            p.grad = None


class Zero3:
    """ZeRO-3 over the ``dp x cp`` group: ``data_parallel.zero3.ShardedUnits`` on a ``GroupView``."""

    def __init__(self, model, g: GroupView, config, probe=NO_PROBE) -> None:
        self.units = ShardedUnits(g, model, prefetch=False, overlap=False, probe=probe)
        self.owned, self.pack, self.unpack = self.units.owned, self.units.pack, self.units.unpack
        self.optimizer = adamw(self.owned, config)

    def after_microbatch(self):
        pass

    def step(self):
        self.units.finish_backward()
        self.optimizer.step()

    def zero_grad(self):
        self.units.start_step()


class TrainingStep:
    """This rank's model part and the step it runs: ``run(tokens)`` trains on this replica's rows."""

    def __init__(self, ctx, layout, config, weights: dict, stage_layers: tuple[range, ...], probe=NO_PROBE,
                 on_saved=None) -> None:
        self.ctx, self.layout, self.config, self.probe, self.on_saved = ctx, layout, config, probe, on_saved
        self.me, self.tpg, self.ring, self.pipe, self.dp_cp = rank_groups(ctx, layout)
        s, pp = self.me.stage, layout.pp
        self.first, self.last = s == 0, s == pp - 1
        self.model = StageModel(weights, config, stage_layers[s], self.first, self.last, self.tpg, self.ring)
        self.schedule = make_schedule("1f1b", pp, config.m)
        placement = "zigzag" if layout.cp > 1 else "contiguous"
        self.positions = positions_of_rank(self.me.cp_rank, layout.cp, config.seq, placement)  # my tokens
        self.tokens_per_step = config.global_tokens(layout.dp)
        self.dp = (Zero3(self.model, self.dp_cp, config, probe) if layout.dp_strategy == "zero3" else
                   DataParallel(self.model, layout.dp_strategy, self.dp_cp, config))

    def saved_hooks(self, microbatch: int):
        """Autograd's saved-tensor hooks for one forward: ZeRO-3's notes for gathered weights, and
        ``on_saved(microbatch)`` shown every tensor that is really kept."""
        see = self.on_saved(microbatch) if self.on_saved else None

        def pack(t):
            out = self.dp.pack(t)
            if see is not None and out is t:
                see(t)
            return out
        return torch.autograd.graph.saved_tensors_hooks(pack, self.dp.unpack)

    def run(self, tokens: torch.Tensor) -> float:
        """One step on this replica's ``(m x microbatch, seq + 1)`` tokens; returns the sum of the token
        losses this rank computed (last stage; 0 elsewhere), over the global batch's token count."""
        c, mb, pos = self.config, self.config.microbatch, self.positions
        x, y = tokens[:, :-1][:, pos], tokens[:, 1:][:, pos]  # (m mb, s/cp): my place in the ring
        shape = (mb, c.seq // (self.layout.cp * self.layout.tp), c.d_model)
        links = Links(self.pipe, self.schedule, self.me.stage, lambda a: shape, self.ctx.device,
                      c.torch_dtype)
        stash, loss = {}, 0.0
        self.dp.zero_grad()
        for a in self.schedule.actions[self.me.stage]:
            k = a.microbatch
            if a.op == "F":
                inp = x[k * mb:(k + 1) * mb] if self.first else links.take(self.schedule.producer(a))
                h = inp if self.first else inp.detach().requires_grad_(True)
                with self.probe.span(a.label, op="F", microbatch=k), self.saved_hooks(k):
                    out = self.model(h, y[k * mb:(k + 1) * mb])  # last: (mb, s/cp) losses; else (mb, s/(cp tp), d)
                stash[k] = (h, out)
                if self.last:
                    loss += float(out.detach().sum()) / self.tokens_per_step
                else:
                    links.put(self.me.stage + 1, out)
            else:
                h, out = stash.pop(k)
                with self.probe.span(a.label, op="B", microbatch=k):
                    if self.last:
                        torch.autograd.backward(out.sum() / self.tokens_per_step)
                    else:
                        torch.autograd.backward(out, links.take(self.schedule.producer(a)))
                    self.dp.after_microbatch()
                if not self.first:
                    links.put(self.me.stage - 1, h.grad)
        links.close()
        with self.probe.span("optimizer", op="optimizer"):
            self.dp.step()
        return loss
