"""torch's own zero-bubble schedules as a peer: their action grids read into this package's ``Schedule``.

``torch.distributed.pipelining`` ships ``ScheduleZBVZeroBubble``, ``ScheduleDualPipeV`` and
``ScheduleInterleavedZeroBubble``; ``_schedule_visualizer.get_schedule_ops`` (a private helper, present
in torch 2.13) lists each rank's actions without running anything. Its ops map onto ours: ``F`` is F,
``I`` (input gradient) is our split B, ``W`` is W, a whole ``B`` is our B then its W at once, and an
``OVERLAP_F_B`` pair is its forward then its backward. Its stage index is our virtual stage. Read this
way, torch's orders are checked by ``check_schedule`` and run by the same engine on the same ranks.
"""

from __future__ import annotations

from .schedules import Action, Schedule

TORCH_SCHEDULES = {"ZBVZeroBubble": "v", "DualPipeV": "v", "InterleavedZeroBubble": "loop"}  # and their placement


def torch_grid(name: str, n_stages: int, n_microbatches: int) -> list[list[str]]:
    """torch's action grid for schedule ``name`` (``TORCH_SCHEDULES``), one list of labels per rank."""
    if name not in TORCH_SCHEDULES:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    ops = get_schedule_ops(name, n_stages, n_microbatches, num_stages_per_rank=2)
    return [[str(a) for a in row if a is not None] for row in ops]


def torch_schedule(name: str, n_stages: int, n_microbatches: int) -> Schedule:
    """torch's order for ``name`` as a checked ``Schedule`` of this package (two chunks per rank)."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    placement = TORCH_SCHEDULES.get(name)
    if placement is None:
        raise ValueError(f"torch schedules read here: {', '.join(TORCH_SCHEDULES)}; got {name!r}")
    p = n_stages

    def chunk_of(vs: int) -> tuple[int, int]:  # (rank, chunk) holding virtual stage vs
        if placement == "v":
            return (vs, 0) if vs < p else (2 * p - 1 - vs, 1)
        return vs % p, vs // p

    def ours(a) -> list[Action]:
        kind = a.computation_type.name
        if kind == "OVERLAP_F_B":
            return [x for sub in a.sub_actions for x in ours(sub)]
        rank, chunk = chunk_of(a.stage_index)
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
    return Schedule(f"torch {name}", p, n_microbatches, True, 2, tuple(tuple(r) for r in rows), placement)
