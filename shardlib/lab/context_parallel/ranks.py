"""Context parallelism's rank functions: each method's attention on this rank's shard of the whole q, k, v.

Each returns this rank's output rows, ``out`` (a ``forward`` span); given the upstream gradient ``d_out``,
the gradients of its shards too (a ``backward`` span) and the bytes its forward saved. ``RingProbe`` adds
each ring step's CPU time to its span and can pad the step. ``train_attention_layer`` is SGD on
``core.model``'s attention layer, in one process or, ``ring_training_on_rank``, through the ring;
``exchange_on_rank`` is one hop on its own, for the link fit.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from shardlib.core.checks import number_at_least
from shardlib.core.config import ModelConfig
from shardlib.core.context_parallel.all_gather import all_gather_kv_attention
from shardlib.core.context_parallel.placement import positions_of_rank, shard_sequence
from shardlib.core.context_parallel.ring import Hop, ring_attention
from shardlib.core.context_parallel.ulysses import ulysses_attention
from shardlib.core.model import attention_layer_reference
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


def _attend(ctx, attend, qkv, placement: str = "contiguous", d_out: torch.Tensor | None = None) -> dict:
    """``attend`` on this rank's shards of the whole ``q, k, v`` (``attend`` checks them, on every rank before
    any message): ``{"out"}``, its rows ``(b, H, s / n, hd)``. With ``d_out`` the backward too: ``"dq", "dk",
    "dv"``, the gradients of its shards, and ``"saved_bytes"``."""
    n, me = ctx.world_size, ctx.rank
    mine = [shard_sequence(t, n, placement)[me].to(ctx.device).requires_grad_(d_out is not None) for t in qkv]
    with ctx.timeline.span("forward", "pass"), SavedBytes(set()) as saved:  # what it keeps for the backward
        out = attend(*mine)
    if d_out is None:
        return {"out": out}
    with ctx.timeline.span("backward", "pass"):
        grads = torch.autograd.grad(out, mine, shard_sequence(d_out, n, placement)[me].to(ctx.device))
    return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2], "saved_bytes": saved.size_bytes}


def ring_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                           placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                           pad_compute_s: float | None = None, d_out: torch.Tensor | None = None):
    """``ring.ring_attention`` on this rank's shard, in ``placement``, of the whole ``q, k, v``, each step's
    compute padded to ``pad_compute_s`` if given."""
    probe = RingProbe(ctx.timeline, pad_compute_s)
    return _attend(ctx, lambda *qkv: ring_attention(ctx, *qkv, causal, placement, overlap, scale, probe),
                   (q, k, v), placement, d_out)


def ulysses_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                              scale: float | None = None, d_out: torch.Tensor | None = None):
    """``ulysses.ulysses_attention`` on this rank's contiguous shard of the whole ``q, k, v``."""
    return _attend(ctx, lambda *qkv: ulysses_attention(ctx, *qkv, causal, scale, probe=ctx.timeline), (q, k, v),
                   d_out=d_out)


def all_gather_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                                 scale: float | None = None) -> dict:
    """``all_gather.all_gather_kv_attention`` on this rank's contiguous shard of the whole ``q, k, v``."""
    return _attend(ctx, lambda *qkv: all_gather_kv_attention(ctx, *qkv, causal, scale), (q, k, v))


def train_attention_layer(x, target, weights: dict, model: ModelConfig, attend=None, steps: int = 5,
                          lr: float = 0.5, positions=None, count: int | None = None,
                          all_reduce=None) -> tuple[list[float], dict]:
    """Plain SGD on ``core.model.attention_layer_reference`` (``weights``: its ``q, k, v, o``; ``x, target (b,
    s, d)``; ``attend`` as it takes it), the loss the squared error against ``target`` summed over ``x``'s
    tokens over ``count`` (default: ``target``'s elements, the mean): the loss before each step and the final
    weights. On a rank holding a shard of the tokens at ``positions``, ``count`` is the whole batch's and
    ``all_reduce`` sums the loss and each gradient over the ranks."""
    total = all_reduce or (lambda t: t)
    count = target.numel() if count is None else count
    w = {name: t.detach().clone().to(x.device).requires_grad_() for name, t in weights.items()}
    losses = []
    for _ in range(steps):
        loss = ((attention_layer_reference(x, w, model, positions, attend) - target) ** 2).sum() / count
        losses.append(float(total(loss.detach().clone())))
        grads = torch.autograd.grad(loss, list(w.values()))
        with torch.no_grad():
            for t, g in zip(w.values(), grads):
                t -= lr * total(g.contiguous())
    return losses, {name: t.detach() for name, t in w.items()}


def ring_training_on_rank(ctx, x, target, weights: dict, model: ModelConfig, causal: bool = True,
                          placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> tuple[list, dict]:
    """``train_attention_layer`` through the ring on this rank's tokens of ``x, target (b, s, d)``, at their
    places in the sequence: its loss is its share of the whole batch's, and the loss and the gradients are
    summed over the ranks."""
    n, seq = ctx.world_size, x.shape[1]
    x, target = (shard_sequence(t, n, placement, dim=1)[ctx.rank].to(ctx.device) for t in (x, target))
    positions = torch.tensor(positions_of_rank(ctx.rank, n, seq, placement), device=ctx.device)  # (s / n,)
    return train_attention_layer(x, target, weights, model,
                                 lambda q, k, v: ring_attention(ctx, q, k, v, causal, placement), steps, lr,
                                 positions, count=target.numel() * n, all_reduce=ctx.comm.all_reduce)


def exchange_on_rank(ctx, size_bytes: int) -> None:
    """One ``ring.Hop``: ``size_bytes`` to the next rank while as many arrive from the previous."""
    Hop(ctx, torch.ones(int(size_bytes) // 4, device=ctx.device)).wait()  # (size / 4,) float32
