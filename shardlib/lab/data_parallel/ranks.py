"""Data-parallel training on a rank, measured: the loop every strategy shares, and a collectives check.

``train_on_rank`` runs ``buckets.BucketedReplica`` (DDP, ZeRO-1/2) or ``zero3.ShardedUnits`` (ZeRO-3)
with a ``BufferProbe`` attached, marks step, forward, backward and optimizer on the timeline, and counts
the bytes the rank keeps. ``collectives_on_rank``: all-reduce against reduce-scatter + all-gather.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field

import torch

from shardlib.core.adamw import AdamW
from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.core.probe import Probe
from shardlib.lab.data_parallel.reference import check_training_inputs, global_mse, local_rows
from shardlib.lab.measure import PeakMeter, optimizer_state_bytes, tensor_bytes


class BufferProbe(Probe):
    """Counts the mechanisms' short-lived buffers in a ``PeakMeter``: a tensor among a span's attributes
    from then until Python frees it (each tensor once); ``gathered_bytes`` from then until a later span's
    ``freed_bytes`` (ZeRO-3 frees a gathered unit's storage itself)."""

    def __init__(self) -> None:
        self.meter = PeakMeter()
        self._followed: set[int] = set()

    def span(self, name: str, kind: str = "compute", **attrs):
        self.meter.reserve(attrs.get("gathered_bytes", 0))
        self.meter.release(attrs.get("freed_bytes", 0))
        for value in attrs.values():
            if isinstance(value, torch.Tensor) and id(value) not in self._followed:
                self._followed.add(id(value))
                weakref.finalize(value, self._followed.discard, id(value))
                self.meter.track(value)
        return contextlib.nullcontext()


def kept_bytes(engine, optimizer, probe: BufferProbe) -> dict[str, int]:
    """Bytes ``engine`` keeps between steps (its weights, gradients and AdamW's state) and the transient
    peak: gradients on their way into buckets, ZeRO-2's staged buckets, all-gathered weights."""
    if isinstance(engine, ShardedUnits):
        params, grads = engine.owned, [shard.grad for shard in engine.owned]
    else:
        params, grads = engine.flats, engine.grads
    return {"params": tensor_bytes(params), "grads": tensor_bytes(grads),
            "optimizer": optimizer_state_bytes(optimizer), "transient_peak": probe.meter.peak_bytes}


@dataclass(frozen=True)
class TrainResult:
    """One rank's training: all the trained weights (by the model's names), this rank's share of each
    step's global loss and, for this package's strategies, ``kept_bytes`` and the flat layout."""

    state_dict: dict
    local_losses: list[float]
    memory: dict[str, int] = field(default_factory=dict)  # kept_bytes: params, grads, optimizer, transient_peak
    groups: tuple = ()  # flat.FlatGroup s


def train_on_rank(ctx, strategy: str, model, batches, lr: float, bucket_bytes: float | None = None,
                  overlap: bool = True, prefetch: bool = True) -> TrainResult:
    """Train ``model`` (this rank's copy of the parent's) on this rank's rows of every batch."""
    check_training_inputs(ctx.world_size, strategy, model, batches, lr, bucket_bytes)
    model = model.to(ctx.device)
    probe = BufferProbe()
    if strategy == "zero3":
        engine = ShardedUnits(ctx, model, prefetch=prefetch, overlap=overlap, probe=probe)
    else:
        engine = BucketedReplica(ctx, model, strategy, bucket_bytes, overlap, probe=probe)
    optimizer = AdamW(engine.owned, lr=lr)
    losses = []
    for k, (x, y) in enumerate(batches):
        mine = local_rows(x.shape[0], ctx.world_size, ctx.rank)
        x_mine, y_mine = x[mine].to(ctx.device), y[mine].to(ctx.device)  # (rows / dp, ...)
        engine.start_step()
        with ctx.timeline.span(f"step {k}", kind="step", step=k):
            with ctx.timeline.span("forward", step=k), engine.forward_context():
                loss = global_mse(model(x_mine), y_mine, y.numel())
            with ctx.timeline.span("backward", step=k):
                loss.backward()
            engine.finish_backward()
            with ctx.timeline.span("optimizer", step=k):
                optimizer.step()  # AdamW on what this rank owns: all the weights (DDP) or its shard (ZeRO)
            engine.after_step()
        losses.append(float(loss.detach()))
    memory = kept_bytes(engine, optimizer, probe)
    return TrainResult(engine.full_state(), losses, memory, tuple(engine.groups))


@dataclass(frozen=True)
class CollectivesResult:
    """The last round's results of both ways of summing one buffer: they must agree."""

    all_reduce: torch.Tensor  # (numel,)
    reduce_scatter_all_gather: torch.Tensor  # (numel,)


def collectives_on_rank(ctx, numel: int, repeats: int = 3) -> CollectivesResult:
    """``repeats`` times: all-reduce a buffer of ``numel`` float32 values (different on every rank), then
    reduce-scatter the same buffer and all-gather the result. Returns both results of the last round;
    the times are in the comm log."""
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    buffer = torch.randn(numel, generator=g).to(ctx.device)  # (numel,), numel divisible by world_size
    for _ in range(repeats):
        ctx.comm.barrier()
        reduced = ctx.comm.all_reduce(buffer.clone())
        ctx.comm.barrier()
        shard = ctx.comm.reduce_scatter(buffer.clone())  # (numel / world_size,)
        both = ctx.comm.all_gather(shard)  # (numel,)
    return CollectivesResult(reduced, both)
