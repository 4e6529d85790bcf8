"""Rank functions that show what communication costs, on live ranks.

* ``sweep_on_rank``: all-reduce, all-to-all and a point-to-point ping-pong timed over message sizes (the
  points ``calibration.fit_link`` fits a latency and a bandwidth to).
* ``tp_comm_replay_on_rank``: exactly the collectives a Megatron-LM tensor-parallel forward pass issues
  (two all-reduces of ``tokens x d_model`` per layer) and nothing else, to set beside
  ``phases.tp_forward_cost``.
* ``slow_rank_on_rank``: one rank delayed before each of several collectives. Every collective is a
  synchronisation point: nobody finishes before the slowest rank arrives, so every rank takes the slow
  rank's time, and the symptom is uniform slowness, not an error.
* ``replica_serve_on_rank`` and ``tp_serve_on_rank``: the same kind of requests served through a stack of
  the toy's MLP layers, as independent replicas (no communication at all) or as one tensor-parallel copy
  (``tensor_parallel.blocks``, split over every rank).
"""

from __future__ import annotations

import time

import torch

from ..checks import number_between, whole_number, whole_number_between
from ..models import ModelConfig
from ..tensor_parallel.blocks import ParallelBlock
from ..tensor_parallel.layers import TPGroup
from ..toy import block_reference, stack_weights
from .calibration import DEFAULT_CALLS, DEFAULT_ROUNDS, DEFAULT_SIZES_BYTES, SWEEP_OPS, check_sizes

SLOW_RANK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
MAX_DELAY_S = 1.0


def sweep_on_rank(ctx, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
                  ops=SWEEP_OPS) -> dict:
    """``{(op, size_bytes): [seconds per call, one per round]}`` as this rank saw them.

    As nccl-tests does, each round times ``calls`` calls issued back to back and divides: that is how
    collectives follow one another in a real forward pass. Every round starts after a barrier, and each
    (op, size) is run once untimed first (buffers allocated, connections warm). The point-to-point
    ping-pong runs between ranks 0 and 1 (rank 0 sends, rank 1 sends it back; one way is half a round
    trip); other ranks only join the barriers, and report ``None``.
    """
    if ctx.world_size < 2:
        raise ValueError("a communication sweep needs at least 2 ranks")
    sizes = check_sizes(sizes_bytes, ctx.world_size)
    for op in ops:
        if op not in SWEEP_OPS:
            raise ValueError(f"the sweep times {', '.join(SWEEP_OPS)}; got {op!r}")

    def once(op: str, x) -> None:
        if op == "all_reduce":
            ctx.comm.all_reduce(x)
        elif op == "all_to_all":
            ctx.comm.all_to_all_single(x)
        elif ctx.rank == 0:
            ctx.comm.send(x, 1)
            ctx.comm.recv(x, 1)
        elif ctx.rank == 1:
            ctx.comm.recv(x, 0)
            ctx.comm.send(x, 0)

    out: dict = {}
    for size in sizes:
        x = torch.ones(size // 4, device=ctx.device)  # (size / 4,) float32
        for op in ops:
            once(op, x)  # warm-up
            per_call = []
            for _ in range(rounds):
                ctx.comm.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    once(op, x)
                elapsed = (time.perf_counter() - start) / calls
                per_call.append(elapsed / 2 if op == "point_to_point" else elapsed)
            out[(op, size)] = None if op == "point_to_point" and ctx.rank > 1 else per_call
    return out


def _activation_dtype(bytes_per_value: float) -> torch.dtype:
    dtypes = {4: torch.float32, 2: torch.float16}
    if bytes_per_value not in dtypes:
        raise ValueError(f"activations of {bytes_per_value} bytes per value: use a model with 2 or 4")
    return dtypes[int(bytes_per_value)]


def tp_comm_replay_on_rank(ctx, model: ModelConfig, tokens: int, repeats: int = 3) -> list[float]:
    """``repeats`` times, the ``2 x n_layers`` all-reduces of one tensor-parallel forward pass over
    ``tokens`` tokens of ``model`` (no compute). Returns this rank's seconds per pass."""
    whole_number(tokens, "tokens")
    whole_number(repeats, "repeats")
    x = torch.ones(tokens, model.d_model, dtype=_activation_dtype(model.bytes_per_param), device=ctx.device)
    ctx.comm.all_reduce(x)  # warm up
    passes = []
    for _ in range(repeats):
        ctx.comm.barrier()
        start = time.perf_counter()
        for _ in range(2 * model.n_layers):  # after attention, after the MLP, in every layer
            ctx.comm.all_reduce(x)  # (tokens, d_model)
        passes.append(time.perf_counter() - start)
    return passes


def slow_rank_on_rank(ctx, slow_rank: int, delay_s: float, n_elements: int = 1024) -> dict:
    """For each collective of ``SLOW_RANK_OPS``: all ranks leave a barrier together, rank ``slow_rank``
    then sleeps ``delay_s`` (a throttled device, say), and everybody calls the collective.

    Returns ``{op: {"step_s": barrier exit to collective end, "collective_s": time inside it}}`` for
    this rank. A fast rank spends about ``delay_s`` inside each collective, waiting.
    """
    whole_number_between(slow_rank, "slow_rank", 0, ctx.world_size - 1)
    number_between(delay_s, "delay_s (seconds)", 0.0, MAX_DELAY_S)
    if whole_number(n_elements, "n_elements") % ctx.world_size:
        raise ValueError(f"n_elements must be a multiple of the {ctx.world_size} ranks, got {n_elements}")
    x = torch.ones(n_elements, device=ctx.device)  # (n_elements,) float32
    calls = {"all_reduce": ctx.comm.all_reduce, "all_gather": ctx.comm.all_gather,
             "reduce_scatter": ctx.comm.reduce_scatter, "all_to_all": ctx.comm.all_to_all_single,
             "barrier": lambda _: ctx.comm.barrier()}
    out = {}
    for op in SLOW_RANK_OPS:
        ctx.comm.barrier()
        start = time.perf_counter()
        if ctx.rank == slow_rank and delay_s > 0:
            with ctx.timeline.span("throttled", kind="compute"):
                time.sleep(delay_s)
        calls[op](x)
        out[op] = {"step_s": time.perf_counter() - start, "collective_s": ctx.comm.records[-1].duration_s}
    return out


# -- serving: replicas against one tensor-parallel copy -----------------------------------------------------
def request_stream(seed: int, steps: int, batch: int, d_model: int) -> torch.Tensor:
    """``steps`` batches of ``batch`` token vectors: one replica's requests, ``(steps, batch, d_model)``."""
    return torch.randn(steps, batch, d_model, generator=torch.Generator().manual_seed(seed))


def replica_serve_on_rank(ctx, model: ModelConfig, seed: int, batch: int, steps: int) -> dict:
    """This rank holds the whole stack (``toy.stack_weights(model, seed, ("mlp",))``) and serves its own
    request stream (stream ``ctx.rank``), talking to nobody. Returns its seconds, tokens and outputs."""
    layers = stack_weights(model, seed, ("mlp",))
    xs = request_stream(seed + 1 + ctx.rank, steps, batch, model.d_model)  # (steps, batch, d_model)
    outputs = torch.empty_like(xs)
    ctx.comm.barrier()
    start = time.perf_counter()
    with torch.no_grad(), ctx.timeline.span("serve", kind="compute"):
        for i in range(steps):
            h = xs[i]  # (batch, d_model)
            for w in layers:
                h = block_reference(h, w, model)
            outputs[i] = h
    return {"seconds": time.perf_counter() - start, "tokens": steps * batch, "outputs": outputs}


def tp_serve_on_rank(ctx, model: ModelConfig, seed: int, batch: int, steps: int) -> dict:
    """The ranks hold one tensor-parallel copy of the same stack (``ParallelBlock`` s split over every
    rank: one all-reduce per layer) and serve request stream 0 together."""
    tpg = TPGroup.world(ctx)
    blocks = [ParallelBlock(w, model, tpg) for w in stack_weights(model, seed, ("mlp",))]
    xs = request_stream(seed + 1, steps, batch, model.d_model)  # (steps, batch, d_model)
    outputs = torch.empty_like(xs)
    ctx.comm.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(steps):
            h = xs[i]  # (batch, d_model), the same on every rank
            for block in blocks:
                h = block(h)
            outputs[i] = h
    seconds = time.perf_counter() - start
    in_all_reduce = sum(rec.duration_s for rec in ctx.comm.records if rec.op == "all_reduce")
    return {"seconds": seconds, "tokens": steps * batch, "outputs": outputs, "all_reduce_s": in_all_reduce}
