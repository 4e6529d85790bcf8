"""Two microbatches through the MoE layer, one's all-to-all in flight while the other computes.

DualPipe (DeepSeek-V3, 2024, arXiv:2412.19437, section 3.2.1) runs one chunk's all-to-all under another's
computation. Here, on the layer's forward for microbatches A and B: A's dispatch is exposed, B's dispatch
flies under A's experts, A's combine under B's experts, B's combine is exposed again: with expert phases
longer than an all-to-all, half the rows' all-to-alls are hidden. ``overlap=False`` runs A then B. The
asynchronous calls return a ``Pending`` whose ``wait()`` records the time blocked. Forward only.
"""

from __future__ import annotations

import torch

from shardlib.core.experts.dispatch import LocalExperts, counts_in, route_and_plan, run_experts, weighted_at_home
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.probe import NO_PROBE


def moe_two_microbatches(ctx, xs: list[torch.Tensor], experts: LocalExperts, router: torch.Tensor,
                         cfg: MoEConfig, overlap: bool = True, probe=NO_PROBE) -> list[torch.Tensor]:
    """The layer (``dispatch.moe_layer``'s phases, no residual) on two microbatches ``xs`` of this rank's
    tokens, each ``(T_mb, d_model)``, the experts over every rank; every rank calls it at once with the
    same ``overlap``."""
    if len(xs) != 2:
        raise ValueError(f"the overlap pairs two microbatches, got {len(xs)}")
    comm, placement = ctx.comm, ExpertPlacement(cfg.n_experts, ctx.world_size)
    with torch.no_grad():
        with probe.span("route", kind="compute"):
            routed = [route_and_plan(x, router, cfg, placement) for x in xs]
        got = [counts_in(ctx, r.plan.counts, placement, ctx.rank) for r in routed]  # both counts first
        rows_to, rows_from = [r.plan.rows_to_rank for r in routed], [g.sum(1).tolist() for g in got]
        sends = [x[r.plan.order // cfg.k] for x, r in zip(xs, routed)]  # (rows out, d_model) each

        def dispatch(i, async_op):
            return comm.all_to_all_single(sends[i], rows_to[i], rows_from[i], async_op=async_op)

        def run(i, received):
            with probe.span("experts", kind="compute", rows=received.shape[0]):
                return run_experts(received, got[i], experts)

        def combine(i, out, async_op):
            return comm.all_to_all_single(out, rows_from[i], rows_to[i], async_op=async_op)

        if not overlap:  # A, then B: every all-to-all exposed
            return [weighted_at_home(combine(i, run(i, dispatch(i, False)), False), routed[i], cfg) for i in (0, 1)]
        received_a = dispatch(0, True).wait()  # exposed: nothing to compute yet
        flying_b = dispatch(1, True)  # B's rows in flight ...
        out_a = run(0, received_a)  # ... under A's experts
        received_b = flying_b.wait()
        flying_a = combine(0, out_a, True)  # A's results in flight ...
        out_b = run(1, received_b)  # ... under B's experts
        back_a = flying_a.wait()
        flying_b = combine(1, out_b, True)  # exposed, but for A's weighted sum
        y_a = weighted_at_home(back_a, routed[0], cfg)
        return [y_a, weighted_at_home(flying_b.wait(), routed[1], cfg)]
