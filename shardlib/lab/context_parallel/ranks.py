"""Context parallelism's rank functions: each method's attention on this rank's shard of the whole q, k, v.

Each returns this rank's output rows (a ``forward`` span); given the upstream gradient ``d_out``, the
gradients of its shards too (a ``backward`` span) and the bytes its forward saved. ``RingProbe`` adds each
ring step's CPU time to its span and can pad the step. ``ring_training_on_rank`` trains a tiny attention
layer through the ring; ``exchange_on_rank`` is one hop on its own, for the link fit.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from shardlib.core.checks import number_at_least
from shardlib.core.context_parallel.all_gather import all_gather_kv_attention, check_all_gather_inputs
from shardlib.core.context_parallel.ring import Hop, check_ring_inputs, ring_attention
from shardlib.core.context_parallel.ulysses import check_ulysses_inputs, ulysses_attention
from shardlib.lab.context_parallel.reference import shard_sequence, train_attention_layer
from shardlib.lab.measure import SavedBytes


class RingProbe:
    """Records each ring step's compute on ``timeline`` with ``cpu_s``, its thread's CPU time. With
    ``pad_compute_s`` each step sleeps out to that length: on a CPU the compute and the transfers share the
    cores, and padding leaves them free for the bytes, as a GPU's links leave its arithmetic free."""

    def __init__(self, timeline, pad_compute_s: float | None = None) -> None:
        self.timeline = timeline
        self.pad_s = None if pad_compute_s is None else number_at_least(pad_compute_s, "pad_compute_s")

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        start_s, cpu_start_s = self.timeline.now_s(), time.thread_time()
        yield
        cpu_s = time.thread_time() - cpu_start_s
        if self.pad_s is not None and start_s + self.pad_s > time.perf_counter():
            time.sleep(start_s + self.pad_s - time.perf_counter())
        self.timeline.record(name, start_s, self.timeline.now_s(), kind, cpu_s=cpu_s, **attrs)


def _attend(ctx, attend, qkv, placement: str = "contiguous", d_out: torch.Tensor | None = None):
    """``attend`` on this rank's shards of the whole ``q, k, v``: its rows ``(b, H, s / n, hd)``. With
    ``d_out`` the backward too: ``{"dq", "dk", "dv", "saved_bytes"}``, the gradients of its shards."""
    n, me = ctx.world_size, ctx.rank
    mine = [shard_sequence(t, n, placement)[me].to(ctx.device).requires_grad_(d_out is not None) for t in qkv]
    with ctx.timeline.span("forward", "pass"), SavedBytes(set()) as saved:  # what it keeps for the backward
        out = attend(*mine)
    if d_out is None:
        return out
    with ctx.timeline.span("backward", "pass"):
        grads = torch.autograd.grad(out, mine, shard_sequence(d_out, n, placement)[me].to(ctx.device))
    return {"dq": grads[0], "dk": grads[1], "dv": grads[2], "saved_bytes": saved.size_bytes}


def ring_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                           placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                           pad_compute_s: float | None = None, d_out: torch.Tensor | None = None):
    """``ring.ring_attention`` on this rank's shard, in ``placement``, of the whole ``q, k, v``, each step's
    compute padded to ``pad_compute_s`` if given."""
    check_ring_inputs(q.shape, k.shape, v.shape, ctx.world_size, placement, local=False)
    probe = RingProbe(ctx.timeline, pad_compute_s)
    return _attend(ctx, lambda *qkv: ring_attention(ctx, *qkv, causal, placement, overlap, scale, probe),
                   (q, k, v), placement, d_out)


def ulysses_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                              scale: float | None = None, d_out: torch.Tensor | None = None):
    """``ulysses.ulysses_attention`` on this rank's contiguous shard of the whole ``q, k, v``."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=False)
    return _attend(ctx, lambda *qkv: ulysses_attention(ctx, *qkv, causal, scale, probe=ctx.timeline), (q, k, v),
                   d_out=d_out)


def all_gather_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                                 scale: float | None = None) -> torch.Tensor:
    """``all_gather.all_gather_kv_attention`` on this rank's contiguous shard of the whole ``q, k, v``."""
    check_all_gather_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=False)
    return _attend(ctx, lambda *qkv: all_gather_kv_attention(ctx, *qkv, causal, scale), (q, k, v))


def ring_training_on_rank(ctx, x, target, weights: dict, head_dim: int, causal: bool = True,
                          placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> tuple[list, dict]:
    """``reference.train_attention_layer`` through the ring on this rank's tokens of ``x, target (b, s, d)``:
    its loss is its share of the whole batch's, and the loss and the gradients are summed over the ranks."""
    x, target = (shard_sequence(t, ctx.world_size, placement, dim=1)[ctx.rank].to(ctx.device) for t in (x, target))
    return train_attention_layer(x, target, weights, head_dim,
                                 lambda q, k, v: ring_attention(ctx, q, k, v, causal, placement), steps, lr,
                                 count=target.numel() * ctx.world_size, all_reduce=ctx.comm.all_reduce)


def exchange_on_rank(ctx, size_bytes: int) -> None:
    """One ``ring.Hop``: ``size_bytes`` to the next rank while as many arrive from the previous."""
    Hop(ctx, torch.ones(int(size_bytes) // 4, device=ctx.device)).wait()  # (size / 4,) float32
