"""The combined forward and decode on ranks, with measurement attached, and the arithmetic speed of a rank.

* ``combined_forward_on_rank``: ``forward.combined_forward`` after a start line (a barrier every rank
  passes once its blocks are built), each microbatch a span on the rank's timeline.
* ``decode_on_rank``: ``forward.pipelined_decode``, with the time each output was ready on the last
  stage, optionally over an ``EmulatedLink`` between "nodes".
* ``effective_flops_per_s`` / ``effective_flops_on_rank``: how fast a rank computes the toy stack.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.serving.layouts import build_stage, combined_forward, pipelined_decode
from shardlib.core.toy import activations, stack_reference
from shardlib.predict.serving.memory import active_params_per_gpu


@dataclass(frozen=True)
class CombinedResult:
    """One rank's combined forward: its stage and replica on the mesh, the output on the last stage (else
    ``None``), and when the forward started and ended (``time.perf_counter``, shared by the ranks)."""

    stage: int
    replica: int
    output: torch.Tensor | None  # (batch / dp, seq, d_model) on the last stage
    start_s: float
    end_s: float
    weight_bytes: int = 0  # the weights this rank's stage keeps: its blocks' slices, its routers and experts


def held_weight_bytes(me) -> int:
    """Bytes of the weights a rank's stage holds (``layouts.RankStage``): its blocks' parameters, and of an
    MoE model each layer's router and the experts at its place of the ep group."""
    tensors = [p for block in me.blocks for p in block.parameters()]
    tensors += [t for part in me.experts for t in (part.router, *part.local)]
    return sum(t.numel() * t.element_size() for t in tensors)


def combined_forward_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             n_microbatches: int = 2) -> CombinedResult:
    """``x`` (batch, seq, d_model) forward on ``layout``'s mesh (``forward.combined_forward``): this rank's
    stage and replica, the output on the last stage (else ``None``), and when the forward started and ended."""
    me = build_stage(ctx, layout, model, layers)
    ctx.comm.barrier()  # a start line: every rank has built its blocks (the driver leaves it out of the traffic)
    start_s = time.perf_counter()
    output = combined_forward(ctx, layout, me, x, n_microbatches, probe=ctx.timeline)
    end_s = time.perf_counter()
    return CombinedResult(me.stage, me.replica, output, start_s, end_s, held_weight_bytes(me))


class _ReadyProbe:
    """The rank's timeline, plus the moment each compute span ended (an output ready on the last stage)."""

    def __init__(self, timeline) -> None:
        self.timeline, self.ready_s = timeline, []

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        with self.timeline.span(name, kind=kind, **attrs):
            yield
        self.ready_s.append(time.perf_counter())


@dataclass(frozen=True)
class DecodeResult:
    """One rank's decode steps: its coordinates; on the last stage every step's output and the time each
    microbatch's was ready (``None`` elsewhere)."""

    stage: int
    replica: int
    tp_rank: int
    outputs: torch.Tensor | None  # (steps, batch / dp, 1, d_model)
    ready_s: list[list[float]] | None  # (steps, m)


def decode_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                   n_microbatches: int, steps: int, emulation=None) -> DecodeResult:
    """``steps`` decode steps of ``x`` (batch, 1, d_model) on ``layout``'s mesh, pipelined in steady state
    (``forward.pipelined_decode``). The last stage returns every step's output and the time each
    microbatch's was ready. ``emulation`` (an ``EmulatedLink``) makes calls that cross "nodes" last as
    long as that link would."""
    if emulation is not None:
        ctx.comm.emulate(emulation)
    me = build_stage(ctx, layout, model, layers)
    probe = _ReadyProbe(ctx.timeline)
    outputs = pipelined_decode(ctx, layout, me, x, n_microbatches, steps, probe)
    if outputs is None:
        return DecodeResult(me.stage, me.replica, me.tp_rank, None, None)
    m = n_microbatches
    return DecodeResult(me.stage, me.replica, me.tp_rank,
                        torch.stack([torch.cat(outputs[k * m:(k + 1) * m]) for k in range(steps)]),
                        [probe.ready_s[k * m:(k + 1) * m] for k in range(steps)])


def effective_flops_per_s(model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 5) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters
    x tokens`` (``memory.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of
    ``batch`` sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch
    overhead dominates, and that is what the toy's compute proxy should include."""
    x = activations(batch, seq, model.d_model)
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
