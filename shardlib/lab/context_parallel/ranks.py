"""Context parallelism's rank functions: ring and all-to-all attention with measurement attached.

``RingProbe`` is what a rank passes to ``ring.ring_attention`` as its ``probe``: each step's compute
becomes a span with the blocks computed and ``cpu_s`` (the CPU time of this rank's thread: on a shared
machine a span's wall time also counts moments another process held the core), padded to
``pad_compute_s`` if set. The comm log records every transfer. ``exchange_sweep_on_rank`` times the
ring's own exchange for the link fit.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_at_least
from shardlib.core.context_parallel.all_gather import all_gather_kv_attention, check_all_gather_inputs
from shardlib.core.context_parallel.placement import blocks_between
from shardlib.core.context_parallel.ring import check_ring_inputs, ring_attention
from shardlib.core.context_parallel.ulysses import check_ulysses_inputs, ulysses_attention
from shardlib.lab.context_parallel.reference import attention_layer, shard_sequence
from shardlib.lab.measure import SavedBytes


class RingProbe:
    """Records each ring step's compute on ``ctx.timeline`` (attrs: ``source``, ``visible``,
    ``diagonal``, ``cpu_s``, ``padded_to_s``). ``pad_compute_s``: pad each step with sleep to that many
    seconds, the blocks still computed for real. On a laptop the compute and the transfers share two
    cores; padding sets the compute's length and leaves the cores free for the bytes, as a GPU's links
    leave its arithmetic free."""

    def __init__(self, ctx, placement: str, causal: bool, pad_compute_s: float | None = None) -> None:
        self.ctx, self.placement, self.causal = ctx, placement, causal
        self.pad = None if pad_compute_s is None else number_at_least(pad_compute_s, "pad_compute_s")

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        timeline = self.ctx.timeline
        start, cpu_start = timeline.now_s(), time.thread_time()
        yield
        cpu_s = time.thread_time() - cpu_start  # this thread's own work, not the time other processes took
        if self.pad is not None and start + self.pad > time.perf_counter():
            time.sleep(start + self.pad - time.perf_counter())
        visible, diagonal = blocks_between(self.ctx.rank, attrs["source"], self.ctx.world_size, self.placement,
                                           self.causal)
        timeline.record(name, start, timeline.now_s(), kind=kind, visible=visible, diagonal=diagonal,
                        cpu_s=cpu_s, padded_to_s=self.pad, **attrs)


def _transfers(records) -> tuple[tuple, ...]:
    return tuple((c.op, c.size_bytes, c.wire_bytes, c.duration_s, c.waited_s) for c in records
                 if c.op in ("send", "recv"))


@dataclass(frozen=True)
class RingResult:
    """One rank's ring passes: of the last run its rows, its steps' blocks and its transfers; per run
    (one entry each) the times."""

    output: torch.Tensor  # (b, H, s / n, hd), this rank's rows
    blocks: tuple[tuple[int, int, int], ...]  # (source, visible, diagonal) per step
    transfers: tuple[tuple, ...]  # (op, size_bytes, wire_bytes, duration_s, waited_s) each
    times_s: list[float]  # the whole pass
    step_compute_s: list[list[float]]  # compute per step, wall time with any padding
    step_cpu_s: list[list[float]]  # the same, CPU time of the computing thread
    waited_s: list[float]  # blocked in wait() for transfers
    transfer_s: list[float]  # per moving step, the longer of the send and the receive, summed


def ring_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                           placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                           repeats: int = 1, pad_compute_s: float | None = None) -> RingResult:
    """``ring_attention`` (forward) on this rank's shard of the whole ``q, k, v``, run ``repeats`` times,
    each after a barrier (the timeline and the comm log keep the last run)."""
    check_ring_inputs(q.shape, k.shape, v.shape, ctx.world_size, placement, local=False)
    mine = [shard_sequence(t, ctx.world_size, placement)[ctx.rank].to(ctx.device) for t in (q, k, v)]
    probe = RingProbe(ctx, placement, causal, pad_compute_s)
    runs = {"times_s": [], "step_compute_s": [], "step_cpu_s": [], "waited_s": [], "transfer_s": []}
    for _ in range(max(1, int(repeats))):
        ctx.comm.barrier()
        ctx.comm.clear()
        ctx.timeline.clear()
        start = time.perf_counter()
        out = ring_attention(ctx, *mine, causal=causal, placement=placement, overlap=overlap, scale=scale,
                             probe=probe)
        runs["times_s"].append(time.perf_counter() - start)
        computed = [s for s in ctx.timeline.spans if s.kind == "compute"]
        runs["step_compute_s"].append([s.duration_s for s in computed])
        runs["step_cpu_s"].append([s.attrs["cpu_s"] for s in computed])
        moved = [c for c in ctx.comm.records if c.op in ("send", "recv")]
        runs["waited_s"].append(sum(c.waited_s or 0.0 for c in moved))
        runs["transfer_s"].append(sum(max(pair) for pair in zip(*[[c.duration_s for c in moved if c.op == op]
                                                                   for op in ("send", "recv")])))
    spans = [s for s in ctx.timeline.spans if s.kind == "compute"]
    return RingResult(out, tuple((s.attrs["source"], s.attrs["visible"], s.attrs["diagonal"]) for s in spans),
                      _transfers(ctx.comm.records), **runs)


@dataclass(frozen=True)
class AttentionGradsResult:
    """One rank's forward and backward of an attention method: its shards of the gradients, the bytes
    its forward saved for the backward, and each pass's calls (ring: ``(op, size_bytes, wire_bytes,
    duration_s, waited_s)``; all-to-all: ``(op, size_bytes, wire_bytes)``)."""

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    saved_bytes: int
    forward: tuple[tuple, ...]
    backward: tuple[tuple, ...]


def ring_attention_grads_on_rank(ctx, q, k, v, d_out, causal: bool = True, placement: str = "contiguous",
                                 overlap: bool = True, scale: float | None = None) -> AttentionGradsResult:
    """Forward and backward of ``ring_attention`` on this rank's shards of the whole ``q, k, v`` and of
    the upstream gradient ``d_out``."""
    check_ring_inputs(q.shape, k.shape, v.shape, ctx.world_size, placement, local=False)
    n, me = ctx.world_size, ctx.rank
    q, k, v, d_out = (shard_sequence(t, n, placement)[me].to(ctx.device) for t in (q, k, v, d_out))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ctx.comm.clear()
    with SavedBytes(set()) as saved:  # what the forward keeps for the backward
        out = ring_attention(ctx, q, k, v, causal, placement, overlap, scale, probe=ctx.timeline)
    forward = len(ctx.comm.records)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), d_out)
    return AttentionGradsResult(dq, dk, dv, saved.size_bytes, _transfers(ctx.comm.records[:forward]),
                                _transfers(ctx.comm.records[forward:]))


@dataclass(frozen=True)
class RingTrainingResult:
    """One rank's training through the ring: the whole loss before each step, and the final weights."""

    losses: list[float]
    weights: dict[str, torch.Tensor]


def ring_training_on_rank(ctx, x, target, weights: dict, head_dim: int, causal: bool = True,
                          placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> RingTrainingResult:
    """Plain SGD on ``reference.attention_layer`` with ring attention: this rank holds its shard of the
    tokens ``x, target (b, s, d)`` and all the weights; the loss is its share of the mean squared error,
    the weight gradients are summed over the ranks (every rank's tokens used the same weights)."""
    n, me = ctx.world_size, ctx.rank
    x, target = (shard_sequence(t, n, placement, dim=1)[me].to(ctx.device) for t in (x, target))
    w = {name: t.clone().to(ctx.device).requires_grad_() for name, t in weights.items()}
    count = target.numel() * n  # elements of the whole batch
    losses = []
    for _ in range(steps):
        y = attention_layer(x, w, head_dim, lambda q, k, v: ring_attention(ctx, q, k, v, causal, placement))
        loss = ((y - target) ** 2).sum() / count  # my share of the mean
        losses.append(float(ctx.comm.all_reduce(loss.detach().clone())))
        grads = torch.autograd.grad(loss, list(w.values()))
        with torch.no_grad():
            for t, g in zip(w.values(), grads):
                t -= lr * ctx.comm.all_reduce(g.contiguous())
    return RingTrainingResult(losses, {name: t.detach().cpu() for name, t in w.items()})


@dataclass(frozen=True)
class UlyssesResult:
    """One rank's all-to-all (or all-gather K/V) attention forward: its rows and ``(op, size_bytes,
    wire_bytes)`` of each call."""

    output: torch.Tensor  # (b, H, s / n, hd)
    collectives: tuple[tuple[str, int, int], ...]


def ulysses_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                              scale: float | None = None,
                              d_out: torch.Tensor | None = None) -> UlyssesResult | AttentionGradsResult:
    """``ulysses_attention`` on this rank's contiguous shard of the whole ``q, k, v``: an ``UlyssesResult``;
    with ``d_out``, the backward too, an ``AttentionGradsResult``."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=False)
    n, me = ctx.world_size, ctx.rank
    mine = [t.chunk(n, dim=2)[me].to(ctx.device).requires_grad_(d_out is not None) for t in (q, k, v)]
    with SavedBytes(set()) as saved:
        out = ulysses_attention(ctx, *mine, causal=causal, scale=scale, probe=ctx.timeline)
    logged = tuple((c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records)
    if d_out is None:
        return UlyssesResult(out, logged)
    grads = torch.autograd.grad(out, mine, d_out.chunk(n, dim=2)[me].to(ctx.device))
    every = tuple((c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records)
    return AttentionGradsResult(*grads, saved.size_bytes, logged, every[len(logged):])


def all_gather_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                                 scale: float | None = None) -> UlyssesResult:
    """``all_gather.all_gather_kv_attention`` on this rank's contiguous shard of the whole ``q, k, v``."""
    check_all_gather_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=False)
    n, me = ctx.world_size, ctx.rank
    mine = [t.chunk(n, dim=2)[me].to(ctx.device) for t in (q, k, v)]
    with ctx.timeline.span("gather K/V, attend my queries"):
        out = all_gather_kv_attention(ctx, *mine, causal=causal, scale=scale)
    return UlyssesResult(out, tuple((c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records))


def exchange_sweep_on_rank(ctx, sizes_bytes, rounds: int = 3) -> dict:
    """Time the ring's own exchange, every rank sending ``size`` bytes to the next while receiving as
    much from the previous (on one machine the two directions share the cores and the wire), each size
    ``rounds`` times after a barrier and one untimed warm-up. Returns ``{("point_to_point", size_bytes):
    [seconds per round]}``, the format of ``lab.costs.ranks.sweep_on_rank``, for ``predict.calibration``."""
    n, me = ctx.world_size, ctx.rank
    out = {}
    for size in sizes_bytes:
        x = torch.ones(int(size) // 4, device=ctx.device)  # (size / 4,) float32
        y = torch.empty_like(x)
        times = []
        for _ in range(int(rounds) + 1):
            ctx.comm.barrier()
            start = time.perf_counter()
            for pending in (ctx.comm.isend(x, (me + 1) % n), ctx.comm.irecv(y, (me - 1) % n)):
                pending.wait()
            times.append(time.perf_counter() - start)
        out[("point_to_point", int(size))] = times[1:]
    return out
