"""The mixture-of-experts layer in one process, what the layer on ranks must equal: ``moe_reference``.

``moe_reference`` is ``dispatch.moe_layer`` with ``ctx=None`` (every expert here) on each group of tokens
that gets its own capacity, with its residual. ``simulate_expert_parallel`` runs the layer's phases for
``ep`` home ranks with lists in place of all-to-alls, at any ``ep``: the same plans, the same expert rows,
the same weighted sum at home. Torch, never ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import whole_number
from shardlib.core.experts.balance import Assignment, split_groups
from shardlib.core.experts.dispatch import MoEWeights, moe_layer, route_and_plan, run_experts, weighted_at_home
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig, check_tokens
from shardlib.core.toy import generator


def make_tokens(n_tokens: int, d_model: int, seed: int = 1) -> torch.Tensor:
    """``(n_tokens, d_model)`` hidden states of unit variance, reproducible from ``seed``."""
    return torch.randn(whole_number(n_tokens, "n_tokens"), whole_number(d_model, "d_model"), generator=generator(seed))


@dataclass(frozen=True)
class MoEOutput:
    output: torch.Tensor  # (T, d_model), the residual included
    assignment: Assignment

    def counts(self, n_experts: int) -> torch.Tensor:
        return self.assignment.counts(n_experts)


def joined(parts: list[Assignment]) -> Assignment:
    """Groups' assignments one after the other (each group had the same capacity)."""
    return Assignment(*(torch.cat([getattr(p, f) for p in parts]) for f in ("experts", "kept", "rerouted")),
                      parts[0].capacity)


def moe_reference(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, n_groups: int = 1) -> MoEOutput:
    """The whole MoE layer with its residual, in one process. ``n_groups`` contiguous groups get their own
    capacity (pass the world size to compare with the layer on ranks)."""
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    parts = [moe_layer(x[a:b], weights.router, weights.experts(), cfg) for a, b in split_groups(x.shape[0], n_groups)]
    return MoEOutput(x + torch.cat([p.output for p in parts]), joined([p.assignment for p in parts]))


def reference_for(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, world_size: int) -> MoEOutput:
    """The single-process layer that the layer on ``world_size`` ranks must equal: each rank's tokens
    form one capacity group."""
    return moe_reference(x, weights, cfg, n_groups=world_size)


def check_layer_inputs(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       world_size: int) -> None:
    """A ValueError with the numbers if the layer cannot run on ``world_size`` ranks as given."""
    if placement.ep != world_size or placement.n_experts != cfg.n_experts:
        raise ValueError(f"the placement is for {placement.n_experts} experts on {placement.ep} ranks, but "
                         f"the layer has {cfg.n_experts} experts on {world_size} ranks")
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    check_tokens(x, cfg.d_model, weights.router.dtype)
    split_groups(x.shape[0], world_size)  # every rank needs a token


# -- the same dispatch in one process -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EPSimulation:
    """The expert-parallel layer's data movement, simulated in one process."""

    output: torch.Tensor  # (T, d_model), the home ranks' outputs joined in rank order, the residual included
    send_matrix: list[list[int]]  # rows sent from rank i (row) to rank j (column)
    expert_rows: list[int]  # rows each rank's experts compute


def simulate_expert_parallel(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                             placement: ExpertPlacement) -> EPSimulation:
    """``dispatch.moe_layer``'s phases on ``placement.ep`` home ranks, lists in place of all-to-alls."""
    w = placement.ep
    check_layer_inputs(x, weights, cfg, placement, w)
    homes = [x[a:b] for a, b in split_groups(x.shape[0], w)]
    routed = [route_and_plan(h, weights.router, cfg, placement) for h in homes]
    first = [sum(len(placement.hosted(r)) for r in range(dst)) for dst in range(w + 1)]  # count vector offsets
    sends = [torch.split(h[r.plan.order // cfg.k], r.plan.rows_to_rank) for h, r in zip(homes, routed)]  # [src][dst]
    results = []  # [dst] -> its experts' output rows, split per source
    for dst in range(w):
        got = torch.stack([r.plan.counts[first[dst]:first[dst + 1]] for r in routed])  # (src, hosted)
        received = torch.cat([sends[src][dst] for src in range(w)])  # (rows, d_model), source by source
        results.append(torch.split(run_experts(received, got, weights.experts(placement.hosted(dst))),
                                   got.sum(1).tolist()))
    outputs = [h + weighted_at_home(torch.cat([results[dst][src] for dst in range(w)]), r, cfg)
               for src, (h, r) in enumerate(zip(homes, routed))]
    return EPSimulation(torch.cat(outputs), [r.plan.rows_to_rank for r in routed],
                        [sum(r.plan.rows_to_rank[dst] for r in routed) for dst in range(w)])
