"""The layouts' rank functions, and the arithmetic speed of a rank. ``lab.harness.on_ranks`` runs them.

* ``combined_forward_on_rank``: ``layouts.combined_forward``, each microbatch a span on the rank's timeline.
* ``decode_on_rank``: ``layouts.pipelined_decode``, optionally over an ``EmulatedLink`` between "nodes"; each
  microbatch's compute is a span, so its end is when that output was ready.
* ``effective_flops_per_s`` / ``effective_flops_on_rank``: how fast a rank computes the toy stack.
"""

from __future__ import annotations

import time

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.serving.layouts import build_stage, combined_forward, pipelined_decode
from shardlib.core.toy import activations, stack_reference
from shardlib.predict.serving.memory import active_params_per_gpu


def held_weight_bytes(me) -> int:
    """Bytes of the weights a rank's stage holds (``layouts.RankStage``): its blocks' parameters, and of an
    MoE model each layer's router and the experts at its place of the ep group."""
    tensors = [p for block in me.blocks for p in block.parameters()]
    tensors += [t for part in me.experts for t in (part.router, *part.local)]
    return sum(t.numel() * t.element_size() for t in tensors)


def combined_forward_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             n_microbatches: int = 2) -> dict:
    """``x`` (batch, seq, d_model) forward on ``layout``'s mesh: the output on the last stage (else ``None``)
    and the bytes of the weights this rank's stage keeps."""
    me = build_stage(ctx, layout, model, layers)
    output = combined_forward(ctx, layout, me, x, n_microbatches, probe=ctx.timeline)
    return {"output": output, "weight_bytes": held_weight_bytes(me)}


def decode_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                   n_microbatches: int, steps: int, emulation=None) -> list[torch.Tensor] | None:
    """``steps`` decode steps of ``x`` (batch, 1, d_model), pipelined in steady state: on tp rank 0 of the last
    stage every microbatch's output, step by step, else ``None`` (the other tp ranks hold the same).
    ``emulation`` (an ``EmulatedLink``) makes calls that cross "nodes" last as long as that link would."""
    ctx.comm.emulate(emulation)
    me = build_stage(ctx, layout, model, layers)
    outputs = pipelined_decode(ctx, layout, me, x, n_microbatches, steps, probe=ctx.timeline)
    return outputs if me.tp_rank == 0 else None


def effective_flops_per_s(model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 5) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters
    x tokens`` (``memory.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of
    ``batch`` sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch
    overhead dominates, and the toy's compute proxy should include it."""
    x = activations(batch, seq, model.d_model)  # (batch, seq, d_model)
    best_s = float("inf")
    with torch.no_grad():
        stack_reference(x, layers, model)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            stack_reference(x, layers, model)
            best_s = min(best_s, time.perf_counter() - start)
    return 2 * active_params_per_gpu(model, Layout(tp=1, pp=1)) * batch * seq / best_s


def effective_flops_on_rank(ctx, model: ModelConfig, layers: list[dict], batch: int, seq: int,
                            repeats: int = 10) -> float:
    """``effective_flops_per_s`` on a rank. Run on every rank at once, it sees what the ranks of a run
    see: the cores they share, the threads they have, each other."""
    return effective_flops_per_s(model, layers, batch, seq, repeats)
