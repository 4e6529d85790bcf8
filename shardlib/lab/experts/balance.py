"""The experts' load read from outside the layer: load statistics, and the mitigations notebook 04 compares
(``replicate_hottest`` plans the copy of the hottest expert)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from shardlib.core.checks import choice
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig


# -- load statistics ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoadStats:
    """How evenly a load (tokens per expert, or per rank) is spread."""

    loads: tuple[int, ...]
    max_over_mean: float  # 1.0 is perfectly even; n means everything on one of n
    cv: float  # coefficient of variation: population std / mean

    def __str__(self) -> str:
        return f"max/mean {self.max_over_mean:.2f}, CV {self.cv:.2f}, loads {list(self.loads)}"


def load_stats(loads, total: float | None = None) -> LoadStats:
    """Max/mean and coefficient of variation of a sequence of loads.

    ``total`` is the load that was to be shared out (default: the sum of ``loads``). Pass every
    requested token-slot, dropped ones included, to measure the busiest against the even share of the
    whole batch: a capacity cap then shows as a lower maximum rather than as a lower mean. The CV is
    always taken around the loads' own mean.
    """
    values = [int(v) for v in (loads.tolist() if isinstance(loads, torch.Tensor) else loads)]
    if not values:
        raise ValueError("load_stats needs at least one load")
    mean = sum(values) / len(values)
    share = mean if total is None else total / len(values)
    if share <= 0:
        return LoadStats(tuple(values), 1.0, 0.0)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return LoadStats(tuple(values), max(values) / share, std / mean if mean else 0.0)


# -- the mitigations -------------------------------------------------------------------------------------------
MITIGATIONS = ("none", "capacity", "capacity + reroute", "replicate hottest")


def mitigated(cfg: MoEConfig, mitigation: str, capacity_factor: float = 1.25) -> MoEConfig:
    """``cfg`` with ``mitigation``'s routing policy (replication changes the placement, not the policy)."""
    choice(mitigation, MITIGATIONS, "mitigation")
    if mitigation == "capacity":
        return cfg.but(capacity_factor=capacity_factor, reroute=False)
    if mitigation == "capacity + reroute":
        return cfg.but(capacity_factor=capacity_factor, reroute=True)
    return cfg.but(capacity_factor=None, reroute=False)


def replicate_hottest(placement: ExpertPlacement, expert_counts) -> ExpertPlacement:
    """A placement with a second copy of the busiest expert on the least-loaded other rank (by the
    token-slots ``expert_counts`` sends to each rank; ties go to the lower number)."""
    counts = [int(c) for c in (expert_counts.tolist() if isinstance(expert_counts, torch.Tensor) else expert_counts)]
    if len(counts) != placement.n_experts:
        raise ValueError(f"expert_counts has {len(counts)} entries, one per expert is {placement.n_experts}")
    hot = max(range(len(counts)), key=lambda e: (counts[e], -e))
    load = [sum(counts[e] for e in placement.hosted(r)) for r in range(placement.ep)]
    others = [r for r in range(placement.ep) if r != placement.owner(hot)]
    if not others:
        raise ValueError("a replica needs a second rank: this placement has one rank")
    target = min(others, key=lambda r: (load[r], r))
    return ExpertPlacement(placement.n_experts, placement.ep, ((hot, target),))
