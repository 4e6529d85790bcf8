"""torch's own zero-bubble schedules as a peer: their action grids as ``Schedule`` s, and their runtime on the
ranks beside ours.

``torch.distributed.pipelining`` ships ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` and
``ScheduleInterleavedZeroBubble``; ``_schedule_visualizer.get_schedule_ops`` (private, in torch 2.13) lists
each rank's actions without running anything. Its ``F`` is F, ``I`` (input gradient) our split B, ``W`` is
W, a whole ``B`` our B then its W, an ``OVERLAP_F_B`` pair its forward then its backward; its stage index
is our virtual stage. So ``torch_schedule`` reads torch's orders into checked ``Schedule`` s for our engine.
``run_torch_runtime`` runs torch's runtime itself (``torch_runtime_on_rank``: one ``PipelineStage`` per
chunk, ``TorchChunk``, and the schedule's ``step``) and sets it beside ``run_pipeline`` of the same order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from shardlib.core.config import ModelConfig
from shardlib.core.model import block_reference
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.schedules import Action, Schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.lab.harness import on_ranks
from shardlib.lab.pipeline.step import (
    PipelineRun,
    check_pipeline_inputs,
    compared,
    gathered_grads,
    gathered_output,
    run_pipeline,
)

TORCH_SCHEDULES = {"ZBVZeroBubble": "v", "DualPipeV": "v", "InterleavedZeroBubble": "loop"}  # and their placement


def _ops(name: str, n_stages: int, n_microbatches: int) -> list:
    """torch's actions for schedule ``name`` (``TORCH_SCHEDULES``), one row per rank (``None``: idle)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    return get_schedule_ops(name, n_stages, n_microbatches, num_stages_per_rank=2)


def torch_grid(name: str, n_stages: int, n_microbatches: int) -> list[list[str]]:
    """torch's action grid for schedule ``name``, one list of labels per rank."""
    return [[str(a) for a in row if a is not None] for row in _ops(name, n_stages, n_microbatches)]


def _virtual_stages(name: str, n_stages: int, rank: int) -> tuple[int, int]:
    """The two virtual stages rank ``rank`` holds: ``(r, 2p-1-r)`` on the V, ``(r, r+p)`` looped."""
    return (rank, 2 * n_stages - 1 - rank) if TORCH_SCHEDULES[name] == "v" else (rank, rank + n_stages)


TORCH_OPS = {"FORWARD": "F", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W", "FULL_BACKWARD": "BW"}  # as ours


def torch_schedule(name: str, n_stages: int, n_microbatches: int) -> Schedule:
    """torch's order for ``name`` as a checked ``Schedule`` of this package (two chunks per rank)."""
    p, ops = n_stages, _ops(name, n_stages, n_microbatches)
    chunk_of = {vs: (r, c) for r in range(p) for c, vs in enumerate(_virtual_stages(name, p, r))}

    def ours(a) -> list[Action]:
        kind = a.computation_type.name
        if kind == "OVERLAP_F_B":  # its forward, then its backward
            return [x for sub in a.sub_actions for x in ours(sub)]
        if kind not in TORCH_OPS:
            raise ValueError(f"torch's {name} lists an action this package does not run: {a}")
        rank, chunk = chunk_of[a.stage_index]
        return [Action(rank, a.microbatch_index, op, chunk) for op in TORCH_OPS[kind]]

    rows = tuple(tuple(x for a in row if a is not None for x in ours(a)) for row in ops)
    return Schedule(f"torch {name}", p, n_microbatches, True, 2, rows, TORCH_SCHEDULES[name])


def import_pipelining_on_rank(ctx) -> None:
    """Start importing ``torch.distributed.pipelining`` (seconds: it loads torch's compiler and DTensor) on
    a thread of this rank and return at once: a pool that would otherwise sit idle gets it done, and a
    later ``torch_runtime_on_rank`` finds it loaded (or waits on Python's import lock until it is)."""
    import threading

    threading.Thread(target=__import__, args=("torch.distributed.pipelining",), daemon=True,
                     name="import-pipelining").start()


class TorchChunk(nn.Module):
    """One virtual stage's layers as the ``nn.Module`` torch's ``PipelineStage`` wraps: the toy's blocks
    (``model.block_reference``) over copies of the given weights, one ``ParameterDict`` per layer."""

    def __init__(self, model: ModelConfig, weights: list[dict]) -> None:
        super().__init__()
        self.model = model
        self.blocks = nn.ModuleList(nn.ParameterDict({k: nn.Parameter(t.detach().clone()) for k, t in w.items()})
                                    for w in weights)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for w in self.blocks:
            h = block_reference(h, dict(w.items()), self.model)
        return h


def torch_runtime_on_rank(ctx, name: str, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor, n_microbatches: int) -> dict:
    """One training step of torch's own schedule ``name`` on this rank: a ``PipelineStage`` for each of
    its two chunks (the same slices of ``layers`` as ``pipeline_step_on_rank``), then ``step``. The loss
    ``(out * g).sum()`` hands the output ``g`` as its gradient; ``scale_grads=False`` keeps the microbatches'
    sum unscaled, as ours. Returns ``output`` (or ``None``), ``grads`` by global layer index, and on rank 0
    torch's ``grid`` and its order as a ``schedule`` (``torch_grid``, ``torch_schedule``)."""
    from torch.distributed import pipelining

    p = ctx.world_size
    mine = _virtual_stages(name, p, ctx.rank)
    slices = split_layers(len(layers), 2 * p)
    chunks = {vs: TorchChunk(model, [layers[i] for i in slices[vs]]).to(ctx.device) for vs in mine}
    stages = [pipelining.PipelineStage(chunks[vs], vs, 2 * p, ctx.device) for vs in mine]
    schedule = getattr(pipelining, f"Schedule{name}")(stages, n_microbatches, scale_grads=False,
                                                      loss_fn=lambda out, g: (out * g).sum())
    args = (x.to(ctx.device),) if 0 in mine else ()
    output = schedule.step(*args, target=grad_output.to(ctx.device) if 2 * p - 1 in mine else None)
    read = ctx.rank == 0
    return {"output": None if output is None else output.detach(),
            "grads": {i: {k: w.grad for k, w in chunks[vs].blocks[j].items()} for vs in mine
                      for j, i in enumerate(slices[vs])},
            "grid": torch_grid(name, p, n_microbatches) if read else None,
            "schedule": torch_schedule(name, p, n_microbatches) if read else None}


@dataclass(frozen=True)
class TorchRuntimeRun:
    """torch's runtime for schedule ``name`` on the pool (its action labels, one list per rank, its output
    and every layer's weight gradients) beside ``ours``, ``run_pipeline`` of the same order: the output and
    every weight gradient ``bit_for_bit``, the ``largest_gap``, ``close`` (within TOLERANCE)."""

    name: str
    grid: list
    output: torch.Tensor = field(repr=False)  # (batch, seq, d_model)
    grads: list = field(repr=False)
    ours: PipelineRun = field(repr=False)
    bit_for_bit: bool
    largest_gap: float
    close: bool


def run_torch_runtime(ranks, name: str, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                      grad_output: torch.Tensor, n_microbatches: int) -> TorchRuntimeRun:
    """One training step of torch's ``Schedule{name}`` (a key of ``TORCH_SCHEDULES``) run by torch on
    ``ranks``, then the same order run by ``run_pipeline``. What torch would refuse (its schedules'
    ``__init__``, microbatches of unequal rows) is a ValueError before any rank starts."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    p, m = ranks.world_size, n_microbatches
    if name == "DualPipeV" and m < 2 * p:
        raise ValueError(f"torch's DualPipeV needs at least as many microbatches as its 2 x {p} stages; got {m}")
    if name == "InterleavedZeroBubble" and m % (rounds := max(1, m // p)):
        raise ValueError(f"torch's InterleavedZeroBubble runs {m} microbatches in {rounds} rounds of {p}: give a "
                         f"multiple of {rounds}")
    same_cut = make_schedule("zb-v", p, m)  # 2 p slices, as torch cuts them
    check_pipeline_inputs(same_cut, layers, tuple(x.shape), tuple(grad_output.shape), p, x.dtype)
    if x.shape[0] % m:
        raise ValueError(f"torch's PipelineStage sizes its receive buffers from the first microbatch, so every "
                         f"microbatch needs as many rows: {m} microbatches must divide the batch's {x.shape[0]} rows")
    got = on_ranks(ranks, torch_runtime_on_rank, name, model, layers, x, grad_output, n_microbatches)
    ours = run_pipeline(ranks, got.first("schedule"), model, layers, x, grad_output)
    output, grads = gathered_output(got), gathered_grads(got)
    pairs = [(output, ours.output)] + [(t[k], o[k]) for t, o in zip(grads, ours.grads, strict=True) for k in o]
    return TorchRuntimeRun(name, got.first("grid"), output, grads, ours, *compared(pairs))
