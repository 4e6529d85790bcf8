"""Where experts live, and how one home rank's token-slots are sent to them: the dispatch plan.

Each of ``ep`` ranks holds ``n_experts / ep`` whole experts (GShard, Lepikhin et al. 2020; Switch
Transformer, Fedus et al. 2021) and a contiguous share of the tokens, its home tokens.
``ExpertPlacement`` says which rank holds which expert, and any second copy of a hot one (``replicas``:
home ranks send alternate rows to the two copies); ``dispatch_plan`` says which of one home rank's rows
go to which rank and expert. ``layout_expert_groups``: on a ``Layout``, the ranks that hold the experts between
them and those that hold the same ones (made through the rank context; never ``torch.distributed`` itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from shardlib.core.checks import whole_number


# -- placement ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertPlacement:
    """Expert ``e`` lives on rank ``e // (n_experts / ep)``; ``replicas`` adds second copies."""

    n_experts: int
    ep: int
    replicas: tuple[tuple[int, int], ...] = ()  # (expert, rank) pairs

    def __post_init__(self) -> None:
        for name in ("n_experts", "ep"):
            whole_number(getattr(self, name), name)
        if self.n_experts % self.ep:
            raise ValueError(
                f"{self.n_experts} experts cannot be placed on {self.ep} ranks: expert parallelism gives "
                f"each rank the same whole number of experts ({self.n_experts} / {self.ep} = "
                f"{self.n_experts / self.ep:.3g}); use an ep that divides {self.n_experts}"
            )
        for pair in self.replicas:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"replicas must be (expert, rank) pairs, for example ((6, 0),); got {pair!r} "
                                 f"in {self.replicas!r}")
        object.__setattr__(self, "replicas", tuple((whole_number(e, "a replica's expert", 0),
                                                    whole_number(r, "a replica's rank", 0)) for e, r in self.replicas))
        for i, (e, r) in enumerate(self.replicas):
            if e >= self.n_experts or r >= self.ep:
                raise ValueError(f"replica ({e}, {r}) names expert {e} of 0 .. {self.n_experts - 1} on rank {r} "
                                 f"of 0 .. {self.ep - 1}")
            if r == self.owner(e):
                raise ValueError(f"expert {e} already lives on rank {r}: its replica must go to another rank")
            if e in (x for x, _ in self.replicas[:i]):
                raise ValueError(f"expert {e} has more than one replica; this layer supports one second copy")

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.ep

    def owner(self, expert: int) -> int:
        return expert // self.per_rank

    def copies(self, expert: int) -> tuple[int, ...]:
        """The ranks holding ``expert``: its owner first, then its replica."""
        return (self.owner(expert),) + tuple(r for e, r in self.replicas if e == expert)

    def hosted(self, rank: int) -> tuple[int, ...]:
        """The experts on ``rank``: its own block, then any replicas."""
        own = tuple(range(rank * self.per_rank, (rank + 1) * self.per_rank))
        return own + tuple(e for e, r in self.replicas if r == rank)

    @property
    def copy_slots(self) -> list[tuple[int, int]]:
        """Every ``(rank, expert)`` copy, rank by rank: the order of a dispatch's count vector."""
        return [(r, e) for r in range(self.ep) for e in self.hosted(r)]


# -- the dispatch plan (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchPlan:
    """How one home rank sends its served token-slots."""

    order: torch.Tensor  # (rows,) flat slot ids ``t * k + s`` in send order (grouped by rank, then expert)
    counts: torch.Tensor  # (len(copy_slots),) rows for each (rank, expert) copy
    rows_to_rank: list[int]  # (ep,) rows sent to each rank, itself included


def dispatch_plan(experts: torch.Tensor, kept: torch.Tensor, placement: ExpertPlacement) -> DispatchPlan:
    """Where each served slot of ``experts`` ``(T, k)`` goes, for one home rank."""
    slot_index = {copy: i for i, copy in enumerate(placement.copy_slots)}
    copies = [[slot_index[(r, e)] for r in placement.copies(e)] for e in range(placement.n_experts)]
    copy_of = torch.tensor([c + c[:1] * (2 - len(c)) for c in copies], device=experts.device)  # (E, 2) copy slots
    slots = torch.nonzero(kept.flatten()).flatten()  # (rows,) served slots, token-major
    expert = experts.flatten()[slots]
    nth = torch.zeros_like(expert)
    if placement.replicas:  # alternate rows between an expert's copies
        onehot = torch.nn.functional.one_hot(expert, placement.n_experts)
        nth = ((onehot.cumsum(0) * onehot).sum(1) - 1) % 2  # the slot is the nth row for its expert here
    target = copy_of[expert, nth]  # (rows,) copy slot
    order = slots[torch.sort(target, stable=True).indices]
    counts = torch.bincount(target, minlength=len(slot_index))
    per_rank = counts.split([len(placement.hosted(r)) for r in range(placement.ep)])
    return DispatchPlan(order, counts, [int(c.sum()) for c in per_rank])


# -- the groups of a Layout --------------------------------------------------------------------------------
_MADE: dict = {}  # (world size, layout's shape, ep, kind) -> this rank's process group, per warm worker
KINDS = {"ep": "ep_groups", "edp": "expert_dp_groups", "stage": "stage_groups"}


class ExpertGroups(NamedTuple):
    """This rank's process groups on a ``Layout``: ``ep`` (``ep`` consecutive ranks of a stage holding the
    experts between them; ``None`` when ``layout.ep = 1``), ``edp`` (the stage's ranks holding the same
    experts), ``stage``; and its place in the ep group (which block of experts it holds)."""

    ep: object | None
    edp: object
    stage: object
    place: int


def _group(ctx, layout, kind: str):
    groups = getattr(layout, KINDS[kind])()
    key = (ctx.world_size, layout.mesh_shape, layout.ep, kind)
    if key not in _MADE:  # as torch.distributed.new_group: every rank makes every group, once per pool
        made = [ctx.new_group(g, kind) for g in groups]
        _MADE[key] = next(pg for g, pg in zip(groups, made) if ctx.rank in g)
    return _MADE[key]


def layout_expert_groups(ctx, layout) -> ExpertGroups:
    """This rank's expert groups on ``layout``, named ``"ep"``, ``"edp"``, ``"stage"`` in the comm log."""
    ep = _group(ctx, layout, "ep") if layout.ep > 1 else None
    edp, stage = _group(ctx, layout, "edp"), _group(ctx, layout, "stage")
    place = next(g.index(ctx.rank) for g in layout.ep_groups() if ctx.rank in g)  # the groups' ranks in order
    return ExpertGroups(ep, edp, stage, place)
