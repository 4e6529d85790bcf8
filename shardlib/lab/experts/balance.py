"""The experts' load measured on ranks, and the mitigations notebook 04 compares: a capacity cap that drops
what overflows (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021), the same with rerouting,
and a second copy of the hottest expert (``replicate_hottest``). Each run is set beside the uncapped layer
and the one-process layer under the same policy (``PolicyRun``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from shardlib.core.checks import choice
from shardlib.core.experts.dispatch import MoEWeights
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.drivers import EPRun, MoEOutput, moe_reference, run_expert_parallel


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


# -- a policy on ranks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyRun:
    """One live run of a routing policy (``cfg``, and whether the hottest expert was replicated): the
    run itself, the loads against their even share (every requested token-slot counted, dropped ones
    included: see ``load_stats``), how the outputs moved against the uncapped layer, and whether the run
    equals the single-process layer under the same policy bit for bit."""

    label: str
    cfg: MoEConfig
    run: EPRun
    tokens_changed: int  # tokens whose output differs from the uncapped layer's
    exact: bool

    slots = property(lambda self: self.run.output.shape[0] * self.cfg.k)  # every requested token-slot
    expert_load = property(lambda self: load_stats(self.run.expert_counts, total=self.slots))
    rank_load = property(lambda self: load_stats(self.run.expert_rows, total=self.slots))


def run_moe_policy(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, replicate: bool = False,
                   repeats: int = 3, uncapped: MoEOutput | None = None, label: str = "") -> PolicyRun:
    """Run the layer with ``cfg``'s routing policy on ``ranks`` (with a second copy of the hottest expert
    when ``replicate``), and measure it against the uncapped layer on the same tokens (``uncapped``,
    computed here unless given). Replication is planned from the uncapped expert loads (in practice,
    from recent batches)."""
    plain = cfg.but(capacity_factor=None, reroute=False)
    with ranks.same_threads():  # references computed as a rank computes, so "exact" means bit for bit
        uncapped = moe_reference(x, weights, plain) if uncapped is None else uncapped
        same_policy = uncapped if cfg == plain else moe_reference(x, weights, cfg, ranks.world_size)
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size)
    if replicate:
        placement = replicate_hottest(placement, uncapped.assignment.counts(cfg.n_experts))
    run = run_expert_parallel(ranks, x, weights, cfg, placement, repeats=repeats)
    change = (run.output - uncapped.output).abs().max(dim=1).values  # (T,) per token
    return PolicyRun(label, cfg, run, int((change > 0).sum()), torch.equal(run.output, same_policy.output))


MITIGATIONS = ("none", "capacity", "capacity + reroute", "replicate hottest")


def run_mitigations(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, mitigations=MITIGATIONS,
                    capacity_factor: float = 1.25, repeats: int = 3) -> dict[str, PolicyRun]:
    """``run_moe_policy`` for each of ``mitigations`` (from ``MITIGATIONS``), by label, sharing one uncapped
    reference: ``"capacity"`` caps each expert at ``capacity_factor`` and drops the overflow, ``"capacity +
    reroute"`` sends it to each token's next choice with room, ``"replicate hottest"`` copies the busiest
    expert (a placement, not a routing policy)."""
    for m in mitigations:
        choice(m, MITIGATIONS, "mitigation")
    plain = cfg.but(capacity_factor=None, reroute=False)
    policies = {"capacity": cfg.but(capacity_factor=capacity_factor, reroute=False),
                "capacity + reroute": cfg.but(capacity_factor=capacity_factor, reroute=True)}
    with ranks.same_threads():
        uncapped = moe_reference(x, weights, plain)
    return {m: run_moe_policy(ranks, x, weights, policies.get(m, plain), m == "replicate hottest", repeats, uncapped, m)
            for m in mitigations}
