"""Rank functions that show what communication costs. ``lab.harness.on_ranks`` runs them, times them and
gathers what they sent.

* ``sweep_on_rank``: one round of a sweep: for each message size, a burst of calls back to back of
  ``one_call`` (an all-reduce, an all-to-all, or a ping-pong between ranks 0 and 1), each a span.
* ``slow_rank_on_rank``: one rank sleeps, then every rank calls one collective.
* ``serve_both_ways_on_rank``: one decode step of the toy's MLP stack (``serving_model``) served as
  independent replicas, then as one tensor-parallel copy (``core.tensor_parallel.blocks``), each a span.

A pool larger than the group a function needs runs it on its first ranks (``leading_group``: the groups
of ``ctx.device_mesh((world_size / n, n), ("copy", "tp"))``); the other ranks return ``None`` at once.
"""

from __future__ import annotations

import time

import torch

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference
from shardlib.core.tensor_parallel.blocks import ParallelBlock
from shardlib.core.tensor_parallel.layers import TPGroup

# the collectives a slow rank is shown on, each with the comm log's name for it
SLOW_RANK_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
                 "all_to_all": "all_to_all_single", "barrier": "barrier"}
MAX_DELAY_S = 1.0


def leading_group(ctx, n_ranks: int | None):
    """``(mesh, member)``: the first ``n_ranks`` ranks of the pool as the ``"tp"`` axis of
    ``ctx.device_mesh`` (``None`` for the whole pool), and whether this rank is one of them."""
    n = ctx.world_size if n_ranks is None else whole_number(n_ranks, "n_ranks (the ranks of the group)", 2)
    if n == ctx.world_size:
        return None, True
    if ctx.world_size % n:
        raise ValueError(f"a group of the first {n} ranks needs a pool whose size is a multiple of {n}, "
                         f"got {ctx.world_size} ranks")
    return ctx.device_mesh((ctx.world_size // n, n), ("copy", "tp")), ctx.rank < n


def one_call(ctx, op: str, x: torch.Tensor, group=None) -> None:
    """One call of ``op`` on ``x``: a collective of ``group``, or a ping-pong between ranks 0 and 1."""
    if op == "all_reduce":
        ctx.comm.all_reduce(x, group=group)
    elif op == "all_to_all":
        ctx.comm.all_to_all_single(x, group=group)
    elif ctx.rank == 0:  # point-to-point: rank 0 sends, rank 1 sends the message back
        ctx.comm.send(x, 1)
        ctx.comm.recv(x, 1)
    elif ctx.rank == 1:
        ctx.comm.recv(x, 0)
        ctx.comm.send(x, 0)


def sweep_on_rank(ctx, points, n_ranks: int | None = None) -> None:
    """One round of a sweep on the first ``n_ranks`` ranks (all by default): for each ``(op, size_bytes,
    calls)`` of ``points``, ``calls`` calls of ``op`` on ``size_bytes`` of float32 back to back, as one span
    ``"burst"`` (a ping-pong: on ranks 0 and 1). As in nccl-tests, a burst over ``calls`` is one call."""
    mesh, member = leading_group(ctx, n_ranks)
    if not member:
        return
    group = None if mesh is None else mesh.get_group("tp")
    for op, size_bytes, calls in points:
        if op == "point_to_point" and ctx.rank > 1:
            continue
        x = torch.ones(size_bytes // 4, device=ctx.device)  # (size_bytes / 4,) float32
        with ctx.timeline.span("burst", kind="comm", op=op, size_bytes=size_bytes):
            for _ in range(calls):
                one_call(ctx, op, x, group)


def slow_rank_on_rank(ctx, op: str, slow_rank: int, delay_s: float) -> None:
    """Rank ``slow_rank`` sleeps ``delay_s`` (a throttled device, say), then every rank calls ``op`` of
    ``SLOW_RANK_OPS``: the fast ranks spend about ``delay_s`` inside it, waiting."""
    x = torch.ones(256 * ctx.world_size, device=ctx.device)  # (256 * world_size,) float32
    if ctx.rank == slow_rank and delay_s > 0:
        with ctx.timeline.span("throttled", kind="compute"):
            time.sleep(delay_s)
    if op == "barrier":
        ctx.comm.barrier()
    else:
        getattr(ctx.comm, SLOW_RANK_OPS[op])(x)


def serving_model(n_layers: int = 4, d_model: int = 512, d_ff: int = 2048) -> ModelConfig:
    """The serving demo's stack: ``n_layers`` of the toy's MLP layers, float32 (heads unused), wide enough
    that arithmetic, not Python's overhead per call, sets a step's time."""
    return ModelConfig("serving stack", n_layers=n_layers, d_model=d_model, n_heads=1, n_kv_heads=1, d_ff=d_ff,
                       vocab_size=1, bytes_per_param=4.0)


def requests(seed: int, batch: int, d_model: int) -> torch.Tensor:
    """One step of one replica's requests: ``batch`` token vectors, ``(batch, d_model)``."""
    return torch.randn(batch, d_model, generator=torch.Generator().manual_seed(seed))


def serve_both_ways_on_rank(ctx, layers: list[dict], model: ModelConfig, seed: int, batch: int,
                            tp: int | None = None) -> dict | None:
    """One decode step each way on the first ``tp`` ranks (default: all), in turn, so both see the same
    machine load: ``{"replica": ..., "tp": ...}``, each ``(batch, d_model)``.

    * ``"replica"``: this rank runs the whole stack ``layers`` on its own requests (``requests(seed + 1 +
      rank)``), talking to nobody;
    * ``"tp"``: the ``tp`` ranks hold one copy of the stack split ``tp`` ways (``ParallelBlock``: one
      all-reduce per layer) and serve ``requests(seed + 1)`` together, rank 0's replica's requests.

    Each way is a span of that name. Ranks outside the group return ``None``.
    """
    mesh, member = leading_group(ctx, tp)
    if not member:
        return None
    tpg = TPGroup.world(ctx) if mesh is None else TPGroup.of_mesh(ctx, mesh, "tp")
    blocks = [ParallelBlock(w, model, tpg) for w in layers]
    h = requests(seed + 1, batch, model.d_model)  # (batch, d_model), the same on every rank of the group
    with torch.no_grad():
        with ctx.timeline.span("replica"):
            replica = stack_reference(requests(seed + 1 + ctx.rank, batch, model.d_model), layers, model)
        with ctx.timeline.span("tp"):
            for block in blocks:
                h = block(h)
    return {"replica": replica, "tp": h}
