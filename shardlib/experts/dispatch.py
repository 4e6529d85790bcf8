"""Expert parallelism, the mechanism: a mixture-of-experts layer whose experts live on different ranks.

GShard (Lepikhin et al. 2020, arXiv:2006.16668) and Switch Transformer (Fedus et al. 2021,
arXiv:2101.03961): each rank holds whole experts and its home tokens. Route at home; an all-to-all
dispatches each token's rows to the ranks holding its experts; the expert FFNs run on the rows
received; the reverse all-to-all combines the results back home; the gates weight them there. Every
collective goes through ``ctx.comm``; measurement attaches through ``probe`` (``ranks``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..runtime.measure import NO_PROBE
from .balance import Assignment, assign
from .placement import ExpertPlacement, dispatch_plan
from .reference import MoEWeights, apply_hosted_experts, combine
from .routing import MoEConfig, route


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
