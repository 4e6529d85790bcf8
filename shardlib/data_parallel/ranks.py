"""Data-parallel training on a rank: the loop every strategy shares, and two measurements of collectives.

``train_on_rank`` takes this rank's contiguous share of each global batch, runs forward, backward and
``torch.optim.AdamW`` on the parameters the strategy gives it (``buckets.BucketedReplica`` for DDP and
ZeRO-1/2, ``zero3.ShardedUnits`` for ZeRO-3), and marks each step, forward, backward and optimizer step
on the timeline, so the driver can cut the comm log into steps and draw what overlapped what.

``collectives_on_rank`` runs an all-reduce, and a reduce-scatter followed by an all-gather, on the same
buffer: the identity every ZeRO byte count rests on, in values, bytes and time.
"""

from __future__ import annotations

import torch

from .buckets import BucketedReplica
from .reference import check_training_inputs, global_mse, local_rows
from .zero3 import ShardedUnits


def train_on_rank(ctx, strategy: str, model, batches, lr: float, bucket_bytes: float | None = None,
                  overlap: bool = True, prefetch: bool = True) -> dict:
    """Train ``model`` (this rank's copy of the parent's) on this rank's rows of every batch.

    Returns ``state_dict`` (all the trained weights, by the model's names), ``memory`` (bytes of
    ``params``, ``grads`` and ``optimizer`` state kept between steps, and ``transient_peak``),
    ``local_losses`` (this rank's share of each step's global loss) and ``groups`` (the flat layout).
    """
    check_training_inputs(ctx.world_size, strategy, model, batches, lr, bucket_bytes)
    model = model.to(ctx.device)
    if strategy == "zero3":
        engine = ShardedUnits(ctx, model, prefetch=prefetch, overlap=overlap)
    else:
        engine = BucketedReplica(ctx, model, strategy, bucket_bytes, overlap)
    optimizer = torch.optim.AdamW(engine.owned, lr=lr)
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
                optimizer.step()
            engine.after_step()
        losses.append(float(loss.detach()))
    memory = engine.memory(optimizer)
    return {"state_dict": engine.full_state(), "memory": memory, "local_losses": losses,
            "groups": engine.groups}


def collectives_on_rank(ctx, numel: int, repeats: int = 3) -> dict:
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
    return {"all_reduce": reduced, "reduce_scatter_all_gather": both}
