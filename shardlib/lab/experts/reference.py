"""The mixture-of-experts layer in one process: expert weights, the expert FFN, ``moe_reference``.

Each expert is Llama's gated MLP (``toy.mlp_reference``) on fixed blocks of rows. ``moe_reference`` is
the whole layer with its residual (route, cap, each expert on its token-slots, the gate-weighted sum):
what the expert-parallel layer on ranks must equal, bit for bit. ``simulate_expert_parallel`` moves the
rows of ``dispatch.expert_parallel_moe`` with lists in place of all-to-alls, at any ``ep``. Torch, never
``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import whole_number
from shardlib.core.experts.balance import Assignment, assign, assign_groups, split_groups
from shardlib.core.experts.dispatch import MoEWeights, apply_hosted_experts, combine, expert_ffn
from shardlib.core.experts.placement import ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, Routing, check_tokens, route
from shardlib.core.toy import generator


def make_tokens(n_tokens: int, d_model: int, seed: int = 1) -> torch.Tensor:
    """``(n_tokens, d_model)`` hidden states of unit variance, reproducible from ``seed``."""
    return torch.randn(whole_number(n_tokens, "n_tokens"), whole_number(d_model, "d_model"), generator=generator(seed))


@dataclass(frozen=True)
class MoEOutput:
    output: torch.Tensor  # (T, d_model)
    routing: Routing
    assignment: Assignment

    def counts(self, n_experts: int) -> torch.Tensor:
        return self.assignment.counts(n_experts)


def moe_reference(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, n_groups: int = 1) -> MoEOutput:
    """The whole MoE layer with its residual, in one process: route, cap, run each expert on its
    token-slots, weight by the gates. ``n_groups`` contiguous groups get their own capacity (pass the
    world size to compare with the layer on ranks)."""
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    routing = route(x, weights.router, cfg)
    assignment = assign_groups(routing, cfg, n_groups)
    flat_experts, flat_kept = assignment.experts.flatten(), assignment.kept.flatten()  # (T * k,)
    slot_outputs = x.new_zeros(x.shape[0] * cfg.k, x.shape[1])  # (T * k, d_model)
    for e in range(cfg.n_experts):
        slots = torch.nonzero(flat_kept & (flat_experts == e)).flatten()
        if slots.numel():
            slot_outputs[slots] = expert_ffn(x[slots // cfg.k], weights, e)
    return MoEOutput(combine(x, routing, assignment, slot_outputs, cfg), routing, assignment)


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

    output: torch.Tensor  # (T, d_model), the home ranks' outputs joined in rank order
    send_matrix: list[list[int]]  # rows sent from rank i (row) to rank j (column)
    expert_rows: list[int]  # rows each rank's experts compute


def simulate_expert_parallel(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                             placement: ExpertPlacement) -> EPSimulation:
    """``dispatch.expert_parallel_moe`` with lists in place of all-to-alls, for any ``ep``: the same
    dispatch plans, the same expert rows, the same weighted sum at home."""
    w = placement.ep
    check_layer_inputs(x, weights, cfg, placement, w)
    homes = [x[a:b] for a, b in split_groups(x.shape[0], w)]
    routed = [route(h, weights.router, cfg) for h in homes]
    assigned = [assign(r, cfg) for r in routed]
    plans = [dispatch_plan(a.experts, a.kept, placement) for a in assigned]
    sizes = [len(placement.hosted(r)) for r in range(w)]
    offsets = [sum(sizes[:r]) for r in range(w)]
    sends = [torch.split(h[p.order // cfg.k], p.rows_to_rank) for h, p in zip(homes, plans)]  # [src][dst]
    results = []  # [dst] -> output rows split per source
    for dst in range(w):
        counts = torch.stack([p.counts[offsets[dst]:offsets[dst] + sizes[dst]] for p in plans])  # (src, hosted)
        received = torch.cat([sends[src][dst] for src in range(w)])  # (rows, d_model), source by source
        out = apply_hosted_experts(received, counts, placement.hosted(dst), weights)
        results.append(torch.split(out, counts.sum(1).tolist()))
    outputs = []
    for src, (h, r, a, p) in enumerate(zip(homes, routed, assigned, plans)):
        slot_outputs = h.new_zeros(h.shape[0] * cfg.k, cfg.d_model)
        slot_outputs[p.order] = torch.cat([results[dst][src] for dst in range(w)])
        outputs.append(combine(h, r, a, slot_outputs, cfg))
    return EPSimulation(torch.cat(outputs), [p.rows_to_rank for p in plans],
                        [sum(p.rows_to_rank[dst] for p in plans) for dst in range(w)])
