"""Data parallelism's rank functions: the training loop every strategy shares, and one buffer summed two ways.

``train_on_rank`` runs ``buckets.BucketedReplica`` (DDP, ZeRO-1/2) or ``zero3.ShardedUnits`` (ZeRO-3)
with a ``lab.measure.BufferProbe`` attached, marks step, forward, backward and optimizer on the timeline, and counts
the bytes the rank keeps. ``summed_on_rank``: one all-reduce, or a reduce-scatter and an all-gather.
"""

from __future__ import annotations

import torch

from shardlib.core.adamw import AdamW
from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.lab.data_parallel.reference import check_training_inputs, global_mse, local_rows
from shardlib.lab.measure import BufferProbe, optimizer_state_bytes, tensor_bytes


def kept_bytes(engine, optimizer, probe: BufferProbe) -> dict[str, int]:
    """Bytes ``engine`` keeps between steps (weights, gradients, AdamW's state) and the transient peak."""
    if isinstance(engine, ShardedUnits):
        params, grads = engine.owned, [shard.grad for shard in engine.owned]
    else:
        params, grads = engine.flats, engine.grads
    return {"params": tensor_bytes(params), "grads": tensor_bytes(grads),
            "optimizer": optimizer_state_bytes(optimizer), "transient_peak": probe.meter.peak_bytes}


def train_on_rank(ctx, strategy: str, model, batches, lr: float, bucket_bytes: float | None = None,
                  overlap: bool = True, prefetch: bool = True) -> dict:
    """Train ``model`` on this rank's rows of every batch: the trained ``state_dict`` (whole), this rank's
    share of each step's global loss (``local_losses``), ``memory`` (``kept_bytes``) and its flat ``groups``."""
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
        x_mine, y_mine = x[mine].to(ctx.device), y[mine].to(ctx.device)  # (rows / dp, d_in), (rows / dp, d_out)
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
    return {"state_dict": engine.full_state(), "local_losses": losses,
            "memory": kept_bytes(engine, optimizer, probe), "groups": tuple(engine.groups)}


def summed_on_rank(ctx, numel: int, split: bool = False) -> torch.Tensor:
    """``numel`` float32 values, different on every rank, summed by an all-reduce or (``split``) by a
    reduce-scatter then an all-gather."""
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    buffer = torch.randn(numel, generator=g).to(ctx.device)  # (numel,), numel divisible by world_size
    if split:
        return ctx.comm.all_gather(ctx.comm.reduce_scatter(buffer))  # (numel / world_size,), then (numel,)
    return ctx.comm.all_reduce(buffer)  # (numel,)
