"""Expert parallelism on a rank: tokens dispatched to their experts' ranks and combined, by all-to-all.

One forward of the layer, on every rank at once (``ep_forward_on_rank``):

1. **route** its home tokens (``routing.route``) and apply the capacity cap to them (each rank's tokens
   are one GShard group);
2. **dispatch**: tell every rank how many token-slots are coming for each of its experts (an
   all-to-all of counts), then send the token rows themselves (an all-to-all with *uneven* splits,
   because the router decided how many go where);
3. **expert FFN**: run each hosted expert on the rows it received;
4. **combine**: send every result back where it came from (the reverse all-to-all, splits swapped);
5. **weighted sum at home**: ``x + sum of gate * result`` over the token's served slots.

Step 3 takes as long as the busiest rank's rows, and step 4 cannot finish on any rank before the
busiest rank has sent its results: one overloaded expert stalls everyone. Every collective goes through
``ctx.comm``, so counts and bytes are read from the comm log.
"""

from __future__ import annotations

import time

import torch

from ..runtime.timeline import now_s
from .layer import MoEWeights, combine
from .placement import ExpertPlacement, check_layer_inputs, dispatch_plan, run_hosted_experts
from .routing import MoEConfig, assign, route, split_groups


def ep_forward_on_rank(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       repeats: int = 1, extra_s_per_row: float = 0.0) -> dict:
    """One expert-parallel forward of ``x`` (the whole batch; this rank keeps its contiguous share),
    ``repeats`` times, each after a barrier. ``extra_s_per_row`` adds a sleep per expert row on top of
    the real FFN, for timing demonstrations that must survive a noisy machine.

    Returns this rank's output rows, what it sent and received, and per repeat its forward and expert
    seconds (wall clock, and the CPU time of the FFNs, which other programs on the machine do not
    inflate) and its start, expert-end and end times on the shared clock. Each rank is sent every
    expert's weights and uses only its own; a deployment would load only those.
    """
    check_layer_inputs(x, weights, cfg, placement, ctx.world_size)
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    x_home = x[start:stop].to(ctx.device)  # (T_r, d_model)
    hosted = placement.hosted(ctx.rank)
    hosted_counts = [len(placement.hosted(r)) for r in range(ctx.world_size)]
    result = {"forward_s": [], "expert_s": [], "expert_cpu_s": [], "start_s": [], "end_s": [], "expert_end_s": []}
    for _ in range(repeats):
        ctx.comm.barrier()
        first_record = len(ctx.comm.records)
        t0 = now_s()
        with ctx.timeline.span("route"):
            routing = route(x_home, weights.router, cfg)
            assignment = assign(routing, cfg)
            plan = dispatch_plan(assignment.experts, assignment.kept, placement)
        # dispatch: the counts first (so every rank knows what it will receive), then the rows
        counts_in = ctx.comm.all_to_all_single(plan.counts, hosted_counts, [len(hosted)] * ctx.world_size)
        counts_in = counts_in.view(ctx.world_size, len(hosted))  # (source rank, hosted expert)
        rows_from = counts_in.sum(1).tolist()
        send = x_home[plan.order // cfg.k]  # (rows sent, d_model), grouped by destination rank
        received = ctx.comm.all_to_all_single(send, plan.rows_to_rank, rows_from)  # (rows received, d_model)
        with ctx.timeline.span("experts", rows=received.shape[0]):
            t_expert, cpu_expert = now_s(), time.process_time()
            expert_out = run_hosted_experts(received, counts_in, hosted, weights)
            expert_cpu_s = time.process_time() - cpu_expert  # work done, whatever else shares the cores
            if extra_s_per_row:
                time.sleep(received.shape[0] * extra_s_per_row)
            expert_end_s = now_s()
        back = ctx.comm.all_to_all_single(expert_out, rows_from, plan.rows_to_rank)  # combine: in send order
        with ctx.timeline.span("weighted sum"):
            slot_outputs = x_home.new_zeros(x_home.shape[0] * cfg.k, cfg.d_model)  # (T_r * k, d_model)
            slot_outputs[plan.order] = back
            out = combine(x_home, routing, assignment, slot_outputs, cfg)
        t1 = now_s()
        for key, value in (("forward_s", t1 - t0), ("expert_s", expert_end_s - t_expert), ("start_s", t0),
                           ("end_s", t1), ("expert_end_s", expert_end_s), ("expert_cpu_s", expert_cpu_s)):
            result[key].append(value)
    counts_rec, tokens_rec, back_rec = [r for r in ctx.comm.records[first_record:] if r.op == "all_to_all_single"]
    result.update(
        output=out, rows_to_rank=plan.rows_to_rank, rows_from_rank=rows_from, expert_rows=int(received.shape[0]),
        expert_counts=assignment.counts(cfg.n_experts), dropped_slots=assignment.dropped_slots,
        dropped_tokens=assignment.dropped_tokens, rerouted_slots=assignment.rerouted_slots,
        capacity=assignment.capacity, counts_bytes=counts_rec.size_bytes, dispatch_bytes=tokens_rec.size_bytes,
        combine_bytes=back_rec.size_bytes, rows_wire_bytes=tokens_rec.wire_bytes + back_rec.wire_bytes, dispatch_s=tokens_rec.duration_s, combine_s=back_rec.duration_s,
        weight_bytes=sum(w[e].numel() * w.element_size() for e in hosted  # the expert weights this rank ran:
                         for w in (weights.gate, weights.up, weights.down)),  # what it must hold (it was sent all)
    )
    return result
