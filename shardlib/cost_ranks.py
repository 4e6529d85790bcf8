"""What communication costs, shown on live ranks: tensor-parallel traffic, one slow rank, replicas vs TP.

* ``tp_comm_replay`` issues exactly the collectives a Megatron-LM tensor-parallel forward pass issues
  (two all-reduces of ``tokens x d_model`` per layer) and nothing else, so their time can be set beside
  ``costs.tp_forward_cost``.
* ``slow_rank_collectives`` delays one rank by a set time before each of several collectives. Every
  collective is a synchronisation point: nobody finishes before the slowest rank arrives, so every rank
  takes the slow rank's time, and the symptom is uniform slowness, not an error.
* ``replica_serve`` and ``tp_serve`` serve the same kind of requests through a small stack of gated MLPs,
  as independent replicas (no communication at all) or as one tensor-parallel copy; ``replicas_vs_tp``
  runs both and sets the tokens per second beside the cost model's prediction.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from .costs import all_reduce_s, replicas_vs_tensor_parallel
from .models import ModelConfig
from .tensor_parallel import shard_columns, shard_rows
from .tp_ranks import mlp_reference

SLOW_RANK_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "barrier")
MAX_DELAY_S = 1.0


def _dtype(bytes_per_value: float) -> torch.dtype:
    dtypes = {4: torch.float32, 2: torch.float16}
    if bytes_per_value not in dtypes:
        raise ValueError(f"activations of {bytes_per_value} bytes per value: use a model with 2 or 4")
    return dtypes[int(bytes_per_value)]


# -- the traffic of a tensor-parallel forward pass ------------------------------------------------------
def tp_comm_replay(ctx, model: ModelConfig, tokens: int, repeats: int = 3) -> list[float]:
    """Rank function: ``repeats`` times, the ``2 x n_layers`` all-reduces of one tensor-parallel forward
    pass over ``tokens`` tokens of ``model`` (no compute). Returns this rank's seconds per pass."""
    if tokens < 1 or repeats < 1:
        raise ValueError(f"tokens and repeats must be at least 1, got tokens={tokens}, repeats={repeats}")
    x = torch.ones(tokens, model.d_model, dtype=_dtype(model.bytes_per_param), device=ctx.device)  # (tokens, d_model)
    ctx.comm.all_reduce(x)  # warm up
    passes = []
    for _ in range(repeats):
        ctx.comm.barrier()
        start = time.perf_counter()
        for _ in range(2 * model.n_layers):  # after attention, after the MLP, in every layer
            ctx.comm.all_reduce(x)
        passes.append(time.perf_counter() - start)
    return passes


def slowest_per_repeat(per_rank: list[list[float]]) -> list[float]:
    """The slowest rank's time in each repeat (a pass ends for everybody when its last rank is done)."""
    return [max(times) for times in zip(*per_rank)]


# -- one slow rank -------------------------------------------------------------------------------------
def slow_rank_collectives(ctx, slow_rank: int, delay_s: float, n_elements: int = 1024) -> dict:
    """Rank function: for each collective of ``SLOW_RANK_OPS``, all ranks leave a barrier together, rank
    ``slow_rank`` then sleeps ``delay_s`` (a throttled device, say), and everybody calls the collective.

    Returns ``{op: {"step_s": barrier exit to collective end, "collective_s": time inside it}}`` for
    this rank. A fast rank spends about ``delay_s`` inside each collective, waiting.
    """
    if not 0 <= slow_rank < ctx.world_size:
        raise ValueError(f"slow_rank must be a rank from 0 to {ctx.world_size - 1}, got {slow_rank}")
    if not 0 <= delay_s <= MAX_DELAY_S:
        raise ValueError(f"delay_s must be between 0 and {MAX_DELAY_S} s, got {delay_s}")
    if n_elements < 1 or n_elements % ctx.world_size:
        raise ValueError(f"n_elements must be a positive multiple of {ctx.world_size} ranks, got {n_elements}")
    x = torch.ones(n_elements, device=ctx.device)  # (n_elements,) float32
    out = {}
    for op in SLOW_RANK_OPS:
        ctx.comm.barrier()
        start = time.perf_counter()
        if ctx.rank == slow_rank and delay_s > 0:
            with ctx.timeline.span("throttled", kind="compute"):
                time.sleep(delay_s)
        if op == "all_reduce":
            ctx.comm.all_reduce(x)
        elif op == "all_gather":
            ctx.comm.all_gather(x)
        elif op == "reduce_scatter":
            ctx.comm.reduce_scatter(x)
        elif op == "all_to_all":
            ctx.comm.all_to_all_single(x)
        else:
            ctx.comm.barrier()
        end = time.perf_counter()
        out[op] = {"step_s": end - start, "collective_s": ctx.comm.records[-1].duration_s}
    return out


# -- replicas vs tensor parallelism ----------------------------------------------------------------------
def mlp_stack_weights(seed: int, n_layers: int, d_model: int, d_ff: int) -> list[tuple[torch.Tensor, ...]]:
    """``n_layers`` gated MLPs ``(gate, up, down)``, scaled so a residual stack stays of order 1."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(d_ff, d_model, generator=g) / d_model ** 0.5,  # gate (d_ff, d_model)
             torch.randn(d_ff, d_model, generator=g) / d_model ** 0.5,  # up (d_ff, d_model)
             torch.randn(d_model, d_ff, generator=g) / d_ff ** 0.5 / n_layers ** 0.5)  # down (d_model, d_ff)
            for _ in range(n_layers)]


def request_stream(seed: int, steps: int, batch: int, d_model: int) -> torch.Tensor:
    """``steps`` batches of ``batch`` token vectors: one replica's requests, ``(steps, batch, d_model)``."""
    return torch.randn(steps, batch, d_model, generator=torch.Generator().manual_seed(seed))


def mlp_stack_reference(x: torch.Tensor, weights) -> torch.Tensor:
    """The unsharded stack: ``x + mlp(x)`` per layer."""
    for gate, up, down in weights:
        x = x + mlp_reference(x, gate, up, down)
    return x


def replica_serve(ctx, seed: int, n_layers: int, d_model: int, d_ff: int, batch: int, steps: int) -> dict:
    """Rank function: this rank holds the whole stack and serves its own request stream (stream
    ``ctx.rank``), talking to nobody. Returns its seconds, tokens served and outputs."""
    weights = mlp_stack_weights(seed, n_layers, d_model, d_ff)
    xs = request_stream(seed + 1 + ctx.rank, steps, batch, d_model)  # (steps, batch, d_model)
    outputs = torch.empty_like(xs)
    ctx.comm.barrier()
    start = time.perf_counter()
    with torch.no_grad(), ctx.timeline.span("serve", kind="compute"):
        for i in range(steps):
            outputs[i] = mlp_stack_reference(xs[i], weights)
    return {"seconds": time.perf_counter() - start, "tokens": steps * batch, "outputs": outputs}


def tp_serve(ctx, seed: int, n_layers: int, d_model: int, d_ff: int, batch: int, steps: int) -> dict:
    """Rank function: the ranks hold one tensor-parallel copy of the stack (gate and up split by columns,
    down by rows, one all-reduce per layer) and serve request stream 0 together."""
    tp, r = ctx.world_size, ctx.rank
    shards = [(torch.cat([shard_columns(gate, tp)[r], shard_columns(up, tp)[r]]),  # (2 d_ff / tp, d_model)
               shard_rows(down, tp)[r])  # (d_model, d_ff / tp)
              for gate, up, down in mlp_stack_weights(seed, n_layers, d_model, d_ff)]
    xs = request_stream(seed + 1, steps, batch, d_model)  # (steps, batch, d_model)
    outputs = torch.empty_like(xs)
    ctx.comm.barrier()
    start = time.perf_counter()
    with torch.no_grad():
        for i in range(steps):
            h = xs[i]  # (batch, d_model), the same on every rank
            for gate_up, down in shards:
                gate, up = F.linear(h, gate_up).chunk(2, dim=-1)  # each (batch, d_ff / tp)
                h = h + ctx.comm.all_reduce(F.linear(F.silu(gate) * up, down))  # partial sums, summed
            outputs[i] = h
    seconds = time.perf_counter() - start
    in_all_reduce = sum(rec.duration_s for rec in ctx.comm.records if rec.op == "all_reduce")
    return {"seconds": seconds, "tokens": steps * batch, "outputs": outputs, "all_reduce_s": in_all_reduce}


def replicas_vs_tp(ranks, link, n_layers: int = 8, d_model: int = 256, d_ff: int = 1024, batch: int = 4,
                   steps: int = 15, rounds: int = 3, seed: int = 0, latency_charge: str = "per_step") -> dict:
    """Serve on ``ranks`` both ways, in ``rounds`` alternating rounds so both see the same machine load.

    Returns the median tokens/s of each way, the cost model's prediction (from each replica's measured
    compute time per step and ``link``'s all-reduce time) and the largest gap between the
    tensor-parallel outputs and the unsharded ones (rank 0's replica served the same stream).
    """
    n = ranks.world_size
    if d_ff % n:
        raise ValueError(f"d_ff = {d_ff} cannot be split {n} ways")
    if rounds < 1 or steps < 1:
        raise ValueError(f"rounds and steps must be at least 1, got rounds={rounds}, steps={steps}")
    args = (seed, n_layers, d_model, d_ff, batch, steps)
    replica_s, tp_s, tp_reduce_s = [], [], []
    for _ in range(rounds):
        replicas = ranks.run(replica_serve, *args)
        tp = ranks.run(tp_serve, *args)
        replica_s.append(max(r["seconds"] for r in replicas))  # the group is done when its slowest is
        tp_s.append(max(r["seconds"] for r in tp))
        tp_reduce_s.append(max(r["all_reduce_s"] for r in tp))
    replica_step_s, tp_step_s = statistics.median(replica_s) / steps, statistics.median(tp_s) / steps
    comm_per_step_s = n_layers * all_reduce_s(batch * d_model * 4, n, link, latency_charge)
    predicted = replicas_vs_tensor_parallel(replica_step_s, comm_per_step_s, n, batch)
    gap = max((r["outputs"] - replicas[0]["outputs"]).abs().max().item() for r in tp)
    return {"replicas_tokens_per_s": n * batch / replica_step_s, "tp_tokens_per_s": batch / tp_step_s,
            "measured_ratio": tp_step_s * n / replica_step_s, "predicted": predicted,
            "replica_step_s": replica_step_s, "tp_step_s": tp_step_s,
            "tp_all_reduce_s_per_step": statistics.median(tp_reduce_s) / steps,
            "predicted_comm_s_per_step": comm_per_step_s, "max_output_gap": gap}
