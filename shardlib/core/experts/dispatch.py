"""Expert parallelism, the mechanism: a mixture-of-experts layer whose experts live on different ranks.

GShard (Lepikhin et al. 2020, arXiv:2006.16668) and Switch Transformer (Fedus et al. 2021,
arXiv:2101.03961): each rank holds whole experts and its home tokens. Route at home; an all-to-all
dispatches each token's rows to the ranks holding its experts; the expert FFNs run on the rows
received; the reverse all-to-all combines the results back home; the gates weight them there. Every
collective goes through ``ctx.comm``; measurement attaches through ``probe`` (``ranks``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from shardlib.core.experts.balance import Assignment, assign, served_gates
from shardlib.core.experts.placement import ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, Routing, blocked_rows, route
from shardlib.core.probe import NO_PROBE
from shardlib.core.toy import generator, mlp_reference, weight


class EPForward(NamedTuple):
    output: torch.Tensor  # (T_r, d_model): this rank's home tokens through the layer
    assignment: Assignment  # the expert serving each home token-slot, or dropped
    rows_to_rank: list[int]  # (ep,) rows this rank sent to each rank, itself included
    rows_from_rank: list[int]  # (ep,) rows this rank's experts received from each rank


def expert_parallel_moe(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                        probe=NO_PROBE) -> EPForward:
    """The layer on this rank's home tokens ``x`` ``(T_r, d_model)``; every rank calls it at once."""
    hosted = placement.hosted(ctx.rank)  # the experts on this rank
    hosted_per_rank = [len(placement.hosted(r)) for r in range(ctx.world_size)]
    # 1. route at home: each token's top-k experts and gates, then the capacity cap (one group per rank)
    with probe.span("route", kind="compute"):
        routing = route(x, weights.router, cfg)  # routing.experts, routing.gates: (T_r, k)
        assignment = assign(routing, cfg)  # the expert serving each slot, or dropped
        plan = dispatch_plan(assignment.experts, assignment.kept, placement)  # send order, rows per rank
    # 2. dispatch: the counts first, so every rank knows how many rows will come for each of its experts...
    counts = ctx.comm.all_to_all_single(plan.counts, hosted_per_rank, [len(hosted)] * ctx.world_size)
    counts = counts.view(ctx.world_size, len(hosted))  # (source rank, hosted expert)
    rows_from = counts.sum(1).tolist()  # (ep,)
    # ...then the rows, with uneven splits: the router decided how many go where
    send = x[plan.order // cfg.k]  # (rows sent, d_model), grouped by destination rank, then expert
    received = ctx.comm.all_to_all_single(send, plan.rows_to_rank, rows_from)  # (rows received, d_model)
    # 3. each hosted expert's FFN on the rows it received
    with probe.span("experts", kind="compute", rows=received.shape[0]):
        expert_out = apply_hosted_experts(received, counts, hosted, weights)  # (rows received, d_model)
    # 4. combine: the reverse all-to-all, splits swapped; results arrive in the order they were sent
    back = ctx.comm.all_to_all_single(expert_out, rows_from, plan.rows_to_rank)  # (rows sent, d_model)
    # 5. weighted sum at home: x + sum over each token's served slots of gate * expert output
    with probe.span("weighted sum", kind="compute"):
        slot_outputs = x.new_zeros(x.shape[0] * cfg.k, cfg.d_model)  # (T_r * k, d_model), slot t * k + s
        slot_outputs[plan.order] = back
        out = combine(x, routing, assignment, slot_outputs, cfg)  # (T_r, d_model)
    return EPForward(out, assignment, plan.rows_to_rank, rows_from)


# -- weights and tokens ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoEWeights:
    """Router rows (unit norm) and each expert's gated MLP, stored ``(out, in)`` as ``F.linear`` takes them."""

    router: torch.Tensor  # (n_experts, d_model)
    gate: torch.Tensor  # (n_experts, d_ff, d_model)
    up: torch.Tensor  # (n_experts, d_ff, d_model)
    down: torch.Tensor  # (n_experts, d_model, d_ff)

    @property
    def n_experts(self) -> int:
        return self.router.shape[0]

    @property
    def d_model(self) -> int:
        return self.router.shape[1]

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's three matrices."""
        return (self.gate[0].numel() + self.up[0].numel() + self.down[0].numel()) * self.gate.element_size()


def make_moe_weights(cfg: MoEConfig, seed: int = 0) -> MoEWeights:
    """Reproducible weights (``toy.weight``): router rows of norm 1 (so tokens of unit variance give
    logits of unit variance, and no expert is favoured), expert matrices scaled by ``1/sqrt(fan_in)``."""
    g = generator(seed)
    router = weight(g, cfg.n_experts, cfg.d_model)
    router = router / router.norm(dim=1, keepdim=True)
    experts = [(weight(g, cfg.d_ff, cfg.d_model), weight(g, cfg.d_ff, cfg.d_model), weight(g, cfg.d_model, cfg.d_ff))
               for _ in range(cfg.n_experts)]
    gate, up, down = (torch.stack(ws) for ws in zip(*experts))
    return MoEWeights(router=router, gate=gate, up=up, down=down)


def expert_ffn(rows: torch.Tensor, weights: MoEWeights, expert: int) -> torch.Tensor:
    """Expert ``expert``'s gated MLP, ``down(silu(gate(x)) * up(x))``, on ``(rows, d_model)``."""
    w_gate, w_up, w_down = weights.gate[expert], weights.up[expert], weights.down[expert]
    return blocked_rows(lambda b: mlp_reference(b, w_gate, w_up, w_down), rows, w_down.shape[0])


def apply_hosted_experts(received: torch.Tensor, counts: torch.Tensor, hosted: tuple[int, ...],
                         weights: MoEWeights) -> torch.Tensor:
    """Run each hosted expert on its rows. ``received`` ``(rows, d_model)`` holds, from each source rank
    in turn, its rows for ``hosted[0]``, then ``hosted[1]``...; ``counts`` is ``(ep, len(hosted))``."""
    out = torch.empty_like(received)  # (rows, d_model)
    ends = counts.flatten().cumsum(0).view_as(counts)  # (ep, len(hosted)): where each block of rows ends
    starts = ends - counts
    for p, e in enumerate(hosted):  # expert e's rows: one block from each source rank
        rows = torch.cat([torch.arange(int(a), int(b)) for a, b in zip(starts[:, p], ends[:, p])])
        if rows.numel():
            out[rows] = expert_ffn(received[rows], weights, e)
    return out


# -- the layer -------------------------------------------------------------------------------------------------
def weighted_sum(x: torch.Tensor, gates: torch.Tensor, slot_outputs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The layer's output at home: ``x + sum_s gate_s * expert_output_s`` over served slots, in slot
    order (elementwise, so it rounds the same whatever the batch)."""
    out = x.clone()  # (T, d_model): the residual
    for s in range(gates.shape[1]):
        weight = torch.where(kept[:, s], gates[:, s], torch.zeros_like(gates[:, s]))  # (T,)
        out = out + weight[:, None] * slot_outputs[:, s]
    return out


def combine(x: torch.Tensor, routing: Routing, assignment: Assignment, slot_outputs: torch.Tensor,
            cfg: MoEConfig) -> torch.Tensor:
    """``weighted_sum`` of ``slot_outputs`` ``(T * k, d_model)``, in flat slot order, with the gates
    ``cfg``'s policy gives (``routing.served_gates``): the one last step of the layer, in one process or
    at home on a rank."""
    gates = served_gates(routing, assignment, cfg)  # (T, k)
    return weighted_sum(x, gates, slot_outputs.view(x.shape[0], cfg.k, -1), assignment.kept)
