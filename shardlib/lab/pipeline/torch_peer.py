"""torch's own zero-bubble schedules as a peer: their action grids as ``Schedule`` s, and their runtime on a rank.

``torch.distributed.pipelining`` ships ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` and
``ScheduleInterleavedZeroBubble``; ``_schedule_visualizer.get_schedule_ops`` (a private helper, present
in torch 2.13) lists each rank's actions without running anything. Its ops map onto ours: ``F`` is F,
``I`` (input gradient) is our split B, ``W`` is W, a whole ``B`` is our B then its W at once, and an
``OVERLAP_F_B`` pair is its forward then its backward. Its stage index is our virtual stage. Read this
way, torch's orders are checked by ``check_schedule`` and run by the same engine on the same ranks.
``torch_runtime_on_rank`` runs torch's runtime itself instead: one ``PipelineStage`` per chunk of the
same layers (``TorchChunk``), the schedule's ``step``, on the pool's gloo (or NCCL) group; rank 0 also
reads the grid, so the kernel need not import ``torch.distributed.pipelining`` (seconds) itself.
"""

from __future__ import annotations

import torch
from torch import nn

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.schedules import Action, Schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.toy import block_reference

TORCH_SCHEDULES = {"ZBVZeroBubble": "v", "DualPipeV": "v", "InterleavedZeroBubble": "loop"}  # and their placement


def torch_grid(name: str, n_stages: int, n_microbatches: int) -> list[list[str]]:
    """torch's action grid for schedule ``name`` (``TORCH_SCHEDULES``), one list of labels per rank."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(name, n_stages, n_microbatches, num_stages_per_rank=2)
    return [[str(a) for a in row if a is not None] for row in ops]


def check_torch_schedule(name: str, n_stages: int, n_microbatches: int) -> None:
    """A ValueError, before any rank starts, for what torch's schedule ``name`` refuses (its ``__init__``)."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    p, m = n_stages, n_microbatches
    if name == "DualPipeV" and m < 2 * p:
        raise ValueError(f"torch's DualPipeV needs at least as many microbatches as its 2 x {p} stages; got {m}")
    rounds = max(1, m // p)
    if name == "InterleavedZeroBubble" and m % rounds:
        raise ValueError(f"torch's InterleavedZeroBubble runs {m} microbatches in {rounds} rounds of {p}: give a "
                         f"multiple of {rounds}")


def _virtual_stages(name: str, n_stages: int, rank: int) -> tuple[int, int]:
    """The two virtual stages rank ``rank`` holds: ``(r, 2p-1-r)`` on the V, ``(r, r+p)`` looped."""
    return (rank, 2 * n_stages - 1 - rank) if TORCH_SCHEDULES[name] == "v" else (rank, rank + n_stages)


def torch_schedule(name: str, n_stages: int, n_microbatches: int) -> Schedule:
    """torch's order for ``name`` as a checked ``Schedule`` of this package (two chunks per rank)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    if name not in TORCH_SCHEDULES:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    p = n_stages
    chunk_of = {vs: (r, c) for r in range(p) for c, vs in enumerate(_virtual_stages(name, p, r))}

    def ours(a) -> list[Action]:
        kind = a.computation_type.name
        if kind == "OVERLAP_F_B":
            return [x for sub in a.sub_actions for x in ours(sub)]
        rank, chunk = chunk_of[a.stage_index]
        i = a.microbatch_index
        if kind == "FORWARD":
            return [Action(rank, i, "F", chunk)]
        if kind == "BACKWARD_INPUT":
            return [Action(rank, i, "B", chunk)]
        if kind == "BACKWARD_WEIGHT":
            return [Action(rank, i, "W", chunk)]
        if kind == "FULL_BACKWARD":
            return [Action(rank, i, "B", chunk), Action(rank, i, "W", chunk)]
        raise ValueError(f"torch's {name} lists an action this package does not run: {a}")

    rows = [[x for a in row if a is not None for x in ours(a)]
            for row in get_schedule_ops(name, p, n_microbatches, num_stages_per_rank=2)]
    return Schedule(f"torch {name}", p, n_microbatches, True, 2, tuple(tuple(r) for r in rows),
                    TORCH_SCHEDULES[name])


def import_pipelining_on_rank(ctx) -> None:
    """Start importing ``torch.distributed.pipelining`` (seconds: it loads torch's compiler and DTensor) on
    a thread of this rank and return at once: a pool that would otherwise sit idle gets it done, and a
    later ``torch_runtime_on_rank`` finds it loaded (or waits on Python's import lock until it is)."""
    import threading

    threading.Thread(target=__import__, args=("torch.distributed.pipelining",), daemon=True,
                     name="import-pipelining").start()


class TorchChunk(nn.Module):
    """One virtual stage's layers as the ``nn.Module`` torch's ``PipelineStage`` wraps: the toy's blocks
    (``toy.block_reference``) over copies of the given weights, one ``ParameterDict`` per layer."""

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
    its two chunks (the same slices of ``layers`` as ``pipeline_step_on_rank``), ``step`` with the batch
    on the rank of the first stage and ``grad_output`` as the target on the rank of the last. The loss
    ``(out * g).sum()`` makes the output's gradient ``g`` itself; ``scale_grads=False`` keeps the sum over
    microbatches unscaled, as ``run_pipeline`` sums it. Returns ``output`` (or ``None``), ``grads`` by
    global layer index, ``virtual_stages``, ``step_s``, and on rank 0 torch's ``grid`` and its order as a
    ``schedule`` (``torch_grid``, ``torch_schedule``)."""
    from torch.distributed import pipelining

    p = ctx.world_size
    mine = _virtual_stages(name, p, ctx.rank)
    slices = split_layers(len(layers), 2 * p)
    chunks = {vs: TorchChunk(model, [layers[i] for i in slices[vs]]).to(ctx.device) for vs in mine}
    stages = [pipelining.PipelineStage(chunks[vs], vs, 2 * p, ctx.device) for vs in mine]
    schedule = getattr(pipelining, f"Schedule{name}")(stages, n_microbatches, scale_grads=False,
                                                      loss_fn=lambda out, g: (out * g).sum())
    args = (x.to(ctx.device),) if 0 in mine else ()
    target = grad_output.to(ctx.device) if 2 * p - 1 in mine else None
    start_s = ctx.timeline.now_s()
    output = schedule.step(*args, target=target)
    step_s = ctx.timeline.now_s() - start_s
    ctx.timeline.record(f"torch {name} step", start_s, start_s + step_s, "compute")
    grads = {i: {k: w.grad for k, w in chunks[vs].blocks[j].items()}
             for vs in mine for j, i in enumerate(slices[vs])}
    read = ctx.rank == 0
    return {"output": None if output is None else output.detach(), "grads": grads, "virtual_stages": mine,
            "step_s": step_s, "grid": torch_grid(name, p, n_microbatches) if read else None,
            "schedule": torch_schedule(name, p, n_microbatches) if read else None}
