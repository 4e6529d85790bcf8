"""Ring attention on a rank, forward and backward: queries stay, keys and values travel round the ring.

Ring Attention (Liu, Zaharia and Abbeel 2023, arXiv:2310.01889), each block's backward as in
FlashAttention-2 (Dao 2023). Forward: at step ``i`` rank ``r`` holds the K/V of rank ``r - i`` (mod
``n``), folds it into its queries' online softmax (``online_softmax.attend_block``) and passes it on to
rank ``r + 1``; it keeps its output and log-sum-exp. Backward: the K/V go round again, each with its
dK/dV accumulator, which gathers every rank's share and, with one more hop after the last step, comes
home; dQ never leaves its rank. Only the KV heads travel (grouped-query attention). Memory per rank
stays O(s / n): the sequence is never gathered. ``probe`` (``core.probe.Probe``) lets measurement
wrap each step's compute from outside.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import flag
from shardlib.core.context_parallel.online_softmax import attend_block, attend_block_backward, check_qkv
from shardlib.core.context_parallel.placement import check_sequence, chunks_of_rank, chunks_per_rank
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


class RingAttention(torch.autograd.Function):
    """The ring's forward and backward on one rank; call it through ``ring_attention``."""

    @staticmethod
    def forward(fn, group, q, k, v, causal, placement, overlap, scale, probe):
        n, me = group.world_size, group.rank
        q_ids = chunks_of_rank(me, n, placement)
        acc = [None] * len(q_ids)  # the online-softmax partial of each of my query chunks
        kv = torch.stack([k, v])  # (2, b, KV, s/n, hd): one message per step
        for step in range(n):
            src = (me - step) % n  # whose K/V I hold now
            hop = Hop(group, kv) if step < n - 1 else None  # the next block starts moving now...
            if hop and not overlap:
                hop.wait()  # ...or, without overlap, arrives before I compute
            with probe.span(f"attend K/V of rank {src}", step=step, source=src):
                attend_block(acc, q.chunk(len(q_ids), dim=2), q_ids, kv[0], kv[1],
                             chunks_of_rank(src, n, placement), causal, scale)
            kv = hop.wait() if hop else kv
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
        for step in range(n):
            src = (me - step) % n
            hop = Hop(group, kv) if step < n - 1 else None
            if hop and not overlap:
                hop.wait()
            with probe.span(f"gradients with K/V of rank {src}", step=step, source=src, phase="backward"):
                attend_block_backward(dq, dkv, rows, q_ids, kv, chunks_of_rank(src, n, placement), causal, scale)
            if n > 1:  # my share is in: dK/dV follow their K/V; after the last step, this hop takes them home
                dkv = Hop(group, dkv).wait()
            kv = hop.wait() if hop else kv
        return None, dq, dkv[0], dkv[1], None, None, None, None, None


def check_ring_inputs(q_shape, k_shape, v_shape, world_size: int, placement: str, local: bool) -> None:
    """Shapes and the split of the whole sequence (or, ``local``, of one rank's shard)."""
    _, _, _, seq, _ = check_qkv(q_shape, k_shape, v_shape)
    if local and seq % chunks_per_rank(placement):
        raise ValueError(f"the zigzag placement gives each rank 2 chunks, so a rank's shard of {seq} tokens must be "
                         f"even (the whole sequence a multiple of 2 x {world_size} = {2 * world_size})")
    check_sequence(seq * world_size if local else seq, world_size, placement)


def ring_attention(group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                   probe=NO_PROBE) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, differentiable. ``q (b, H, s/n, hd)``,
    ``k, v (b, KV, s/n, hd)``: this rank's shard in ``placement`` (``reference.shard_sequence``); returns
    ``(b, H, s/n, hd)``. ``group`` is the ring: ``ctx`` (every rank of the job) or a ``ctx.group(...)``;
    every rank of it must call it (and its backward). ``overlap=False``: each block arrives before it is
    computed (the baseline the overlap is measured against)."""
    check_ring_inputs(q.shape, k.shape, v.shape, group.world_size, placement, local=True)
    return RingAttention.apply(group, q, k, v, flag(causal, "causal"), placement, flag(overlap, "overlap"), scale,
                               probe)
