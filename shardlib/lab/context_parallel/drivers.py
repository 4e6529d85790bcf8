"""Context parallelism run on a pool, against the unsharded attention, the work count and the cost model.

Each rank function attends this rank's shard of the whole q, k, v and returns its output rows, ``out`` (a
``forward`` span); given the upstream gradient ``d_out``, the gradients of its shards too (a ``backward``
span) and the bytes its forward saved. ``RingProbe`` adds each ring step's CPU time to its span and can
pad the step. ``run_ring_attention``, ``run_ulysses_attention`` and ``run_all_gather_attention`` each
return an ``AttentionRun``: the output's gap, the ring's compute, step time and transfers, or the
collectives against ``predict``; with ``d_out`` (ring, Ulysses), every rank's dQ, dK, dV shards against
autograd through the whole sequence's attention and the backward's wire bytes. Inputs are checked here,
before any rank starts.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import TOLERANCE, flag, number_at_least, whole_number
from shardlib.core.context_parallel.all_gather import all_gather_kv_attention
from shardlib.core.context_parallel.online_softmax import check_shards
from shardlib.core.context_parallel.placement import gather_sequence, shard_sequence
from shardlib.core.context_parallel.ring import ring_attention
from shardlib.core.context_parallel.ulysses import check_heads_divide, ulysses_attention
from shardlib.core.model import attention
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.measure import SavedBytes
from shardlib.predict.context_parallel import (
    AttentionShape,
    RankWork,
    all_gather_kv_collectives,
    blocks_between,
    causal_work,
    imbalance,
    ulysses_collectives,
)


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


def attention_and_grads(q, k, v, d_out=None, causal: bool = True, scale=None) -> tuple[torch.Tensor, ...]:
    """The whole sequence's attention output and, given ``d_out``, autograd's ``(dq, dk, dv)`` of it."""
    q, k, v = (t.detach().requires_grad_(d_out is not None) for t in (q, k, v))
    out = attention(q, k, v, causal=causal, scale=scale)
    return (out.detach(),) if d_out is None else (out.detach(), *torch.autograd.grad(out, (q, k, v), d_out))


def attention_shape(q: torch.Tensor, k: torch.Tensor) -> AttentionShape:
    b, heads, seq, hd = q.shape
    return AttentionShape(b, heads, k.shape[1], seq, hd, q.element_size())


@dataclass(frozen=True)
class AttentionRun:
    """An attention method on a pool, ``repeats`` times, against the whole sequence's attention
    (``reference``: its output and, with a backward, ``(dq, dk, dv)``), and its prediction: the ring's work
    (``predict.causal_work``) or the collectives, ``(op, size_bytes, wire_bytes)`` each, against rank 0's
    ``measured``. Times are medians over the repeats (per rank, or of the slowest rank); ``compute_cpu_s``
    is CPU time, which a busy machine does not inflate. Blocks, bytes and spans are the last repeat's. The
    gradients are checked with ``rtol = atol = TOLERANCE``."""

    got: Measured = field(repr=False)
    placement: str
    causal: bool
    reference: tuple[torch.Tensor, ...] = field(repr=False)
    predicted_work: tuple[RankWork, ...] = ()
    predicted: tuple[tuple, ...] = ()

    world_size = property(lambda self: len(self.got.times_s))
    output = property(lambda self: gather_sequence(self.got.each("out"), self.placement))  # (b, H, s, hd)
    gap = property(lambda self: float((self.output - self.reference[0]).abs().max()))
    saved_bytes = property(lambda self: self.got.each("saved_bytes"))
    spans = property(lambda self: self.got.spans())

    def _steps(self, rank: int, repeat: int = -1) -> list:
        """The rank's ring steps in ``repeat``, in order, each a compute span from ``RingProbe``."""
        return [s for s in self.got.spans(None, rank, repeat) if s.kind == "compute"]

    @property
    def compute_cpu_s(self) -> tuple[float, ...]:
        """Per rank, the CPU time of its ring steps, the median over the repeats."""
        return tuple(statistics.median(sum(s.attrs["cpu_s"] for s in self._steps(r, i)) for i in range(len(times)))
                     for r, times in enumerate(self.got.times_s))

    def _slowest(self, figure) -> float:
        """The median over the repeats of the slowest rank's ``figure(rank, repeat)``."""
        return statistics.median(max(figure(r, i) for r in range(self.world_size))
                                 for i in range(len(self.got.times_s[0])))

    @property
    def step_compute_s(self) -> tuple[float, ...]:
        return tuple(self._slowest(lambda r, i: self._steps(r, i)[step].duration_s) for step in range(self.world_size))

    @property
    def step_s(self) -> float:
        return self._slowest(lambda r, i: self.got.spans("forward", r, i)[0].duration_s)

    @property
    def waited_s(self) -> float:
        return self._slowest(lambda r, i: sum(c.waited_s or 0.0 for c in self.got.records(None, r, i)))

    @property
    def transfer_s(self) -> float:  # per moving step the longer of the send and the receive, summed
        return self._slowest(lambda r, i: sum(max(s.duration_s, v.duration_s) for s, v in
                                              zip(self.got.records("send", r, i), self.got.records("recv", r, i))))

    @property
    def computed_blocks(self) -> tuple[int, ...]:
        """Blocks each rank computed against the K/V its steps met (the prediction is ``predicted_work``)."""
        return tuple(sum(sum(blocks_between(r, s.attrs["source"], self.world_size, self.placement, self.causal))
                         for s in self._steps(r)) for r in range(self.world_size))

    @property
    def sent_bytes_per_rank(self) -> tuple[int, ...]:
        return tuple(self.got.bytes(None, r, wire=True) for r in range(self.world_size))

    @property
    def measured(self) -> tuple[tuple, ...]:
        return tuple((c.op, c.size_bytes, c.wire_bytes) for c in self.got.records(rank=0))

    @property
    def measured_imbalance(self) -> float:
        """The busiest rank's compute (CPU time) over the mean (1: even)."""
        return max(self.compute_cpu_s) * self.world_size / sum(self.compute_cpu_s)

    predicted_imbalance = property(lambda self: imbalance(self.predicted_work))  # the same, from the blocks

    @property
    def shards(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        """Each rank's ``(dq, dk, dv)``: the gradients of its shards (none without a backward)."""
        if len(self.reference) == 1:
            return ()
        return tuple(zip(*(self.got.each(name) for name in ("dq", "dk", "dv"))))

    @property
    def reference_shards(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        """Autograd's ``(dq, dk, dv)`` cut as each rank holds its shard."""
        return tuple(zip(*(shard_sequence(t, self.world_size, self.placement) for t in self.reference[1:])))

    @property
    def gaps(self) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float((a - b).abs().max()) for a, b in zip(mine, want))
                     for mine, want in zip(self.shards, self.reference_shards))

    def _sent(self, part: str) -> int:
        """Rank 0's wire bytes in the ``part`` span (``forward`` or ``backward``)."""
        (span,) = self.got.spans(part, rank=0)
        return sum(c.wire_bytes for c in self.got.within(span))

    forward_wire_bytes = property(lambda self: self._sent("forward"))
    backward_wire_bytes = property(lambda self: self._sent("backward"))

    @property
    def exact(self) -> bool:
        """The output within ``TOLERANCE`` and, with a backward, every rank's every gradient too."""
        return self.gap <= TOLERANCE and all(torch.allclose(mine, ref, rtol=TOLERANCE, atol=TOLERANCE)
                                             for got, want in zip(self.shards, self.reference_shards)
                                             for mine, ref in zip(got, want))


def run_ring_attention(ranks, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                       placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                       repeats: int = 1, pad_compute_s: float | None = None,
                       d_out: torch.Tensor | None = None) -> AttentionRun:
    """``ring.ring_attention`` on every rank, each on its shard of the whole ``q (b, H, s, hd)``, ``k, v
    (b, KV, s, hd)`` in ``placement``, ``repeats`` times, each step's compute padded to ``pad_compute_s``;
    with ``d_out``, the upstream gradient of the whole output (shaped like ``q``), the backward too."""
    check_shards(q.shape, k.shape, v.shape, ranks.world_size, placement)
    flag(causal, "causal")
    flag(overlap, "overlap")
    if pad_compute_s is not None:
        number_at_least(pad_compute_s, "pad_compute_s")
    got = on_ranks(ranks, ring_attention_on_rank, q, k, v, causal, placement, overlap, scale, pad_compute_s,
                   d_out=d_out, repeats=whole_number(repeats, "repeats"))
    return AttentionRun(got, placement, causal, attention_and_grads(q, k, v, d_out, causal, scale),
                        tuple(causal_work(q.shape[2], ranks.world_size, placement, causal)))


def _heads_run(ranks, fn, collectives, q, k, v, causal: bool, scale, **d_out) -> AttentionRun:
    got = on_ranks(ranks, fn, q, k, v, flag(causal, "causal"), scale, **d_out)
    predicted = tuple((op, int(size), int(round(wire))) for op, size, wire in
                      collectives(attention_shape(q, k), ranks.world_size))
    return AttentionRun(got, "contiguous", causal, attention_and_grads(q, k, v, d_out.get("d_out"), causal, scale),
                        predicted=predicted)


def run_ulysses_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None,
                          d_out: torch.Tensor | None = None) -> AttentionRun:
    """``ulysses.ulysses_attention`` on every rank, against ``predict.ulysses_collectives``; with ``d_out``
    the backward too, which runs the four all-to-alls again, each the transpose of its forward."""
    _, heads, kv_heads, _, _ = check_shards(q.shape, k.shape, v.shape, ranks.world_size)
    check_heads_divide(heads, kv_heads, ranks.world_size)
    return _heads_run(ranks, ulysses_attention_on_rank, ulysses_collectives, q, k, v, causal, scale, d_out=d_out)


def run_all_gather_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None) -> AttentionRun:
    """``all_gather.all_gather_kv_attention`` on every rank, against ``predict.all_gather_kv_collectives``."""
    check_shards(q.shape, k.shape, v.shape, ranks.world_size)
    return _heads_run(ranks, all_gather_attention_on_rank, all_gather_kv_collectives, q, k, v, causal, scale)
