"""Ring attention on a rank, forward and backward: queries stay, keys and values travel round the ring.

Ring Attention (Liu, Zaharia and Abbeel 2023, arXiv:2310.01889), each block's backward as in
FlashAttention-2 (Dao 2023). Forward: at step ``i`` rank ``r`` holds the K/V of rank ``r - i`` (mod
``n``), folds it into its queries' online softmax (``online_softmax.attend_block``) and passes it on to
rank ``r + 1``; it keeps its output and log-sum-exp. Backward: the K/V go round again, each with its
dK/dV accumulator, which gathers every rank's share and, with one more hop after the last step, comes
home; dQ never leaves its rank. Only the KV heads travel (grouped-query attention). Memory per rank
stays O(s / n): the sequence is never gathered. ``probe`` (``core.probe.Probe``) lets measurement
wrap each step's compute from outside. ``simulate_ring_attention`` plays every rank's ``ring_pass`` in one
process, each block taken from a list instead of ``travelling`` in from the previous rank.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import flag
from shardlib.core.context_parallel.online_softmax import attend_block, attend_block_backward, check_shards
from shardlib.core.context_parallel.placement import chunks_of_rank, gather_sequence, shard_sequence
from shardlib.core.probe import NO_PROBE


class Hop:
    """``t`` sent to the next rank while the previous rank's arrives; ``wait()`` returns the arrival."""

    def __init__(self, group, t: torch.Tensor) -> None:
        n, me = group.world_size, group.rank
        self.arriving = torch.empty_like(t)
        self.pending = (group.comm.isend(t, (me + 1) % n), group.comm.irecv(self.arriving, (me - 1) % n))

    def wait(self) -> torch.Tensor:
        for pending in self.pending:
            pending.wait()
        return self.arriving


def travelling(group, kv: torch.Tensor, overlap: bool):
    """``(step, source rank, its K/V block)`` at each step of the ring. The block held now starts on to the
    next rank before the caller computes on it (without ``overlap``, the previous rank's arrives first)."""
    n, me = group.world_size, group.rank
    for step in range(n):
        hop = Hop(group, kv) if step < n - 1 else None  # the next block starts moving now...
        if hop and not overlap:
            hop.wait()  # ...or, without overlap, arrives before I compute
        yield step, (me - step) % n, kv
        kv = hop.wait() if hop else kv


def ring_pass(q: torch.Tensor, me: int, n: int, blocks, causal: bool, placement: str, scale=None,
              probe=NO_PROBE) -> list:
    """Rank ``me``'s queries ``q (b, H, s/n, hd)`` against each ``(step, source, kv)`` of ``blocks``
    (``kv (2, b, KV, s/n, hd)``, the source's K and V): each query chunk's online-softmax ``Partial``."""
    q_ids = chunks_of_rank(me, n, placement)
    acc = [None] * len(q_ids)
    for step, src, kv in blocks:
        with probe.span(f"attend K/V of rank {src}", step=step, source=src):
            attend_block(acc, q.chunk(len(q_ids), dim=2), q_ids, kv[0], kv[1], chunks_of_rank(src, n, placement),
                         causal, scale)
    return acc


class RingAttention(torch.autograd.Function):
    """The ring's forward and backward on one rank; call it through ``ring_attention``."""

    @staticmethod
    def forward(fn, group, q, k, v, causal, placement, overlap, scale, probe):
        kv = torch.stack([k, v])  # (2, b, KV, s/n, hd): one message per step
        acc = ring_pass(q, group.rank, group.world_size, travelling(group, kv, overlap), causal, placement, scale,
                        probe)
        out = torch.cat([a.out for a in acc], dim=2)  # (b, H, s/n, hd)
        lse = torch.cat([a.log_sum_exp for a in acc], dim=2)  # (b, H, s/n): all the backward keeps
        fn.save_for_backward(q, k, v, out, lse)
        fn.setup = (group, causal, placement, overlap, scale, probe)
        return out

    @staticmethod
    def backward(fn, d_out):
        q, k, v, out, lse = fn.saved_tensors
        group, causal, placement, overlap, scale, probe = fn.setup
        n, me = group.world_size, group.rank
        q_ids = chunks_of_rank(me, n, placement)
        rows = (q, d_out, lse, (d_out * out).sum(-1))  # delta = rowsum(dO * O): (b, H, s/n)
        dq = torch.zeros_like(q)  # stays here
        kv = torch.stack([k, v])  # (2, b, KV, s/n, hd): goes round again...
        dkv = torch.zeros_like(kv)  # ...with its dK/dV accumulator
        for step, src, kv in travelling(group, kv, overlap):
            with probe.span(f"gradients with K/V of rank {src}", step=step, source=src, phase="backward"):
                attend_block_backward(dq, dkv, rows, q_ids, kv, chunks_of_rank(src, n, placement), causal, scale)
            if n > 1:  # my share is in: dK/dV follow their K/V; after the last step, this hop takes them home
                dkv = Hop(group, dkv).wait()
        return None, dq, dkv[0], dkv[1], None, None, None, None, None


def ring_attention(group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                   probe=NO_PROBE) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, differentiable. ``q (b, H, s/n, hd)``,
    ``k, v (b, KV, s/n, hd)``: this rank's shard in ``placement`` (``placement.shard_sequence``); returns
    ``(b, H, s/n, hd)``. ``group`` is the ring: ``ctx`` (every rank of the job) or a ``ctx.group(...)``;
    every rank of it must call it (and its backward). ``overlap=False``: each block arrives before it is
    computed (the baseline the overlap is measured against)."""
    check_shards(q.shape, k.shape, v.shape, group.world_size, placement, local=True)
    return RingAttention.apply(group, q, k, v, flag(causal, "causal"), placement, flag(overlap, "overlap"), scale,
                               probe)


def simulate_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int, causal: bool = True,
                            placement: str = "contiguous", scale: float | None = None) -> torch.Tensor:
    """Ring attention over ``world_size`` simulated ranks on the whole ``q (b, H, s, hd)``, ``k, v (b, KV,
    s, hd)``: each rank meets every K/V shard in ring order (its own, then rank ``r - 1``'s, ...), folded in
    by ``attend_block`` as on the ranks; the outputs gathered back into sequence order. Equal to
    ``core.model.attention`` within float32 rounding (the blocks are summed in another order)."""
    check_shards(q.shape, k.shape, v.shape, world_size, placement, local=False)
    flag(causal, "causal")
    n, qs = world_size, shard_sequence(q, world_size, placement)  # per rank: (b, H, s/n, hd)
    kvs = [torch.stack(kv) for kv in zip(*(shard_sequence(t, n, placement) for t in (k, v)))]  # (2, b, KV, s/n, hd)
    outs = []
    for me in range(n):
        acc = ring_pass(qs[me], me, n, ((i, (me - i) % n, kvs[(me - i) % n]) for i in range(n)), causal, placement,
                        scale)
        outs.append(torch.cat([a.out for a in acc], dim=2))  # (b, H, s/n, hd)
    return gather_sequence(outs, placement)
