"""The expert groups of a ``Layout`` on a rank: its expert-parallel group, its expert-data-parallel group,
and its stage's group, each a process group made once per pool and named in the comm log.

``Layout.ep_groups`` (``ep`` consecutive ranks of a stage: the experts of each MoE layer spread over
them), ``Layout.expert_dp_groups`` (the ranks of a stage holding the same experts) and
``Layout.stage_groups`` (every rank of a stage) give the ranks; like ``torch.distributed.new_group``,
every rank of the job makes every group, members or not, so the first call on a pool makes them all and
later calls reuse them. Logged as ``"ep"``, ``"edp"`` and ``"stage"``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch.distributed as dist

_MADE: dict = {}  # (world size, layout's shape, ep, kind) -> this rank's process group, per warm worker
KINDS = {"ep": "ep_groups", "edp": "expert_dp_groups", "stage": "stage_groups"}


class ExpertGroups(NamedTuple):
    """This rank's process groups (``ep`` is ``None`` when ``layout.ep = 1``: every expert on every rank; the
    others may be a group of one) and its place in the ep group."""

    ep: object | None
    edp: object
    stage: object
    place: int  # this rank's index in its ep group: which block of experts it holds


def _group(ctx, layout, kind: str):
    groups = getattr(layout, KINDS[kind])()
    key = (ctx.world_size, layout.mesh_shape, layout.ep, kind)
    if key not in _MADE:
        made = [ctx.new_group(g, kind) for g in groups]  # every rank makes every group
        _MADE[key] = next(pg for g, pg in zip(groups, made) if ctx.rank in g)
    return _MADE[key]


def layout_expert_groups(ctx, layout) -> ExpertGroups:
    """This rank's expert groups on ``layout`` (the module docstring)."""
    ep = _group(ctx, layout, "ep") if layout.ep > 1 else None
    edp, stage = _group(ctx, layout, "edp"), _group(ctx, layout, "stage")
    place = 0 if ep is None else dist.get_rank(ep)  # the group's ranks in order: its place is its expert block
    return ExpertGroups(ep, edp, stage, place)
