"""Rank functions that show what communication costs, on live ranks.

* ``sweep_on_rank``: all-reduce, all-to-all and a point-to-point ping-pong (``one_call``) timed over
  message sizes, the points ``calibration.fit_link`` fits a latency and a bandwidth to.
* ``slow_rank_on_rank``: one rank delayed before each of several collectives (every collective is a
  synchronisation point: the symptom is uniform slowness, not an error).
* ``serve_both_ways_on_rank``: the toy's MLP stack serving requests step by step in turn as independent
  replicas and as one tensor-parallel copy (``core.tensor_parallel.blocks``), under the same machine load.

A pool larger than the group a function needs runs it on its first ranks (``leading_group``: the groups
of ``ctx.device_mesh((world_size / n, n), ("copy", "tp"))``); the other ranks return ``None`` at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_between, whole_number, whole_number_between
from shardlib.core.config import ModelConfig
from shardlib.core.tensor_parallel.blocks import ParallelBlock
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.toy import block_reference, stack_weights
from shardlib.predict.calibration import DEFAULT_CALLS, DEFAULT_ROUNDS, DEFAULT_SIZES_BYTES, SWEEP_OPS, check_sizes

SLOW_RANK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
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


def _tp_group(mesh):
    return None if mesh is None else mesh.get_group("tp")


def _sweep_group(ctx, sizes_bytes, ops, n_ranks: int | None):
    """``(group, member, sizes)`` of a sweep, every argument checked before any call."""
    mesh, member = leading_group(ctx, n_ranks)
    n = ctx.world_size if mesh is None else n_ranks
    if n < 2:
        raise ValueError("a communication sweep needs at least 2 ranks")
    sizes = check_sizes(sizes_bytes, n)
    for op in ops:
        if op not in SWEEP_OPS:
            raise ValueError(f"the sweep times {', '.join(SWEEP_OPS)}; got {op!r}")
    return _tp_group(mesh), member, sizes


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


def sweep_on_rank(ctx, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
                  ops=SWEEP_OPS, n_ranks: int | None = None, warm_up: bool = True) -> dict | None:
    """``{(op, size_bytes): [seconds per call, one per round]}`` as this rank saw them.

    As nccl-tests does, a round times ``calls`` calls back to back and divides; every round starts after
    a barrier, and each (op, size) runs once untimed first (with ``warm_up=False``, only the smallest size
    of each op: the processes woken, the buffers of a previous sweep reused). The ping-pong's one way is
    half its round trip; ranks outside it report ``None`` for it, ranks outside the first ``n_ranks``
    return ``None``.
    """
    group, member, sizes = _sweep_group(ctx, sizes_bytes, ops, n_ranks)
    if not member:
        return None
    out: dict = {}
    for size in sizes:
        x = torch.ones(size // 4, device=ctx.device)  # (size / 4,) float32
        for op in ops:
            if warm_up or size == min(sizes):
                one_call(ctx, op, x, group)  # warm-up: buffers allocated, connections made
            per_call = []
            for _ in range(rounds):
                ctx.comm.barrier(group=group)  # every rank starts the round together
                start = time.perf_counter()
                for _ in range(calls):
                    one_call(ctx, op, x, group)
                elapsed = (time.perf_counter() - start) / calls
                per_call.append(elapsed / 2 if op == "point_to_point" else elapsed)
            out[(op, size)] = None if op == "point_to_point" and ctx.rank > 1 else per_call
    return out


@dataclass(frozen=True)
class SlowRankTimes:
    """One rank's seconds per op of ``SLOW_RANK_OPS``, in their order: from leaving the barrier to the
    collective's end (``step_s``), and inside the collective (``collective_s``)."""

    step_s: dict[str, float]
    collective_s: dict[str, float]


def slow_rank_on_rank(ctx, slow_rank: int, delay_s: float, n_elements: int = 1024) -> SlowRankTimes:
    """For each collective of ``SLOW_RANK_OPS``: all ranks leave a barrier together, rank ``slow_rank``
    then sleeps ``delay_s`` (a throttled device, say), and everybody calls the collective. A fast rank
    spends about ``delay_s`` inside each collective, waiting.
    """
    whole_number_between(slow_rank, "slow_rank", 0, ctx.world_size - 1)
    number_between(delay_s, "delay_s (seconds)", 0.0, MAX_DELAY_S)
    if whole_number(n_elements, "n_elements") % ctx.world_size:
        raise ValueError(f"n_elements must be a multiple of the {ctx.world_size} ranks, got {n_elements}")
    x = torch.ones(n_elements, device=ctx.device)  # (n_elements,) float32
    calls = {"all_reduce": ctx.comm.all_reduce, "all_gather": ctx.comm.all_gather,
             "reduce_scatter": ctx.comm.reduce_scatter, "all_to_all": ctx.comm.all_to_all_single,
             "barrier": lambda _: ctx.comm.barrier()}
    step_s, collective_s = {}, {}
    for op in SLOW_RANK_OPS:
        ctx.comm.barrier()
        start = time.perf_counter()
        if ctx.rank == slow_rank and delay_s > 0:
            with ctx.timeline.span("throttled", kind="compute"):
                time.sleep(delay_s)
        calls[op](x)
        step_s[op], collective_s[op] = time.perf_counter() - start, ctx.comm.records[-1].duration_s
    return SlowRankTimes(step_s, collective_s)


# -- serving: replicas against one tensor-parallel copy -----------------------------------------------------
def request_stream(seed: int, steps: int, batch: int, d_model: int) -> torch.Tensor:
    """``steps`` batches of ``batch`` token vectors: one replica's requests, ``(steps, batch, d_model)``."""
    return torch.randn(steps, batch, d_model, generator=torch.Generator().manual_seed(seed))


@dataclass(frozen=True)
class ServedBothWays:
    """One rank's seconds per step each way (from leaving a barrier of the group), its seconds inside
    all-reduces per tensor-parallel step, and both ways' outputs."""

    replica_s: list[float]
    tp_s: list[float]
    all_reduce_s: list[float]
    replica_outputs: torch.Tensor  # (steps, batch, d_model)
    tp_outputs: torch.Tensor  # (steps, batch, d_model)


def serve_both_ways_on_rank(ctx, model: ModelConfig, seed: int, batch: int, steps: int,
                            tp: int | None = None) -> ServedBothWays | None:
    """The first ``tp`` ranks (default: all) serve ``steps`` decode steps of ``batch`` sequences each
    way, in turn, so both see the same machine load:

    * a replica step: this rank runs the whole stack (``toy.stack_weights(model, seed, ("mlp",))``) on
      its own request stream (stream ``seed + 1 + rank``), talking to nobody;
    * a tensor-parallel step: the ``tp`` ranks hold one copy of the same stack split ``tp`` ways
      (``ParallelBlock``: one all-reduce per layer) and serve stream ``seed + 1`` together, the stream
      rank 0's replica serves, so the two outputs can be compared.

    One untimed step each way first (buffers allocated). Ranks outside the group return ``None``.
    """
    whole_number(batch, "batch")
    whole_number(steps, "steps")
    mesh, member = leading_group(ctx, tp)
    if not member:
        return None
    group = _tp_group(mesh)
    tpg = TPGroup.world(ctx) if mesh is None else TPGroup.of_mesh(ctx, mesh, "tp")
    layers = stack_weights(model, seed, ("mlp",))
    blocks = [ParallelBlock(w, model, tpg) for w in layers]
    mine = request_stream(seed + 1 + ctx.rank, steps, batch, model.d_model)  # (steps, batch, d_model)
    shared = request_stream(seed + 1, steps, batch, model.d_model)  # (steps, batch, d_model)
    replica_out, tp_out = torch.empty_like(mine), torch.empty_like(shared)
    replica_s, tp_s = [], []

    def replica_step(h):  # (batch, d_model), this rank's own requests
        for w in layers:
            h = block_reference(h, w, model)
        return h

    def tp_step(h):  # (batch, d_model), the same on every rank of the group
        for block in blocks:
            h = block(h)
        return h

    with torch.no_grad():
        replica_step(mine[0]), tp_step(shared[0])  # warm-up, untimed
        for i in range(steps):
            ctx.comm.barrier(group=group)
            start = time.perf_counter()
            replica_out[i] = replica_step(mine[i])
            replica_s.append(time.perf_counter() - start)
            ctx.comm.barrier(group=group)
            start = time.perf_counter()
            tp_out[i] = tp_step(shared[i])
            tp_s.append(time.perf_counter() - start)
    per_step = len(blocks)  # one all-reduce per MLP layer; the first step's were the warm-up
    reduces = [r.duration_s for r in ctx.comm.records if r.op == "all_reduce"][per_step:]
    reduce_s = [sum(reduces[i:i + per_step]) for i in range(0, len(reduces), per_step)]
    return ServedBothWays(replica_s, tp_s, reduce_s, replica_out, tp_out)
