"""Two microbatches through the MoE layer, one's all-to-all in flight while the other computes.

DualPipe (DeepSeek-V3, 2024, arXiv:2412.19437, section 3.2.1) pairs two chunks so that the all-to-all
of one runs under the computation of the other. This is that idea on the layer's forward, for two
microbatches A and B: A's dispatch is exposed (nothing else is ready), B's dispatch flies under A's
experts, A's combine under B's experts, and B's combine is exposed again. With each expert phase
longer than an all-to-all, half of the rows' all-to-alls are hidden. ``overlap=False`` runs A then B,
every all-to-all blocking. The asynchronous calls are ``ctx.comm.all_to_all_single(..., async_op=True)``,
which return a ``Pending``; ``wait()`` records how long the rank was blocked (``waited_s``). Forward
only, no gradient: DualPipe also pairs one chunk's forward with another's backward, not built here.
"""

from __future__ import annotations

import torch

from shardlib.core.experts.autograd import LocalExperts, local_expert_rows, plan_dispatch, weighted_at_home
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.probe import NO_PROBE


def moe_two_microbatches(ctx, xs: list[torch.Tensor], experts: LocalExperts, router: torch.Tensor,
                         cfg: MoEConfig, group=None, overlap: bool = True, probe=NO_PROBE) -> list[torch.Tensor]:
    """The layer (``autograd.moe_forward``'s phases, no residual) on two microbatches ``xs`` of this
    rank's tokens, each ``(T_mb, d_model)``; every rank calls it at once with the same ``overlap``."""
    if len(xs) != 2:
        raise ValueError(f"the overlap pairs two microbatches, got {len(xs)}")
    comm = ctx.comm
    with torch.no_grad():
        plans = [plan_dispatch(ctx, x, experts, router, cfg, group, probe=probe) for x in xs]  # both counts first
        sends = [x[p.order // cfg.k] for x, p in zip(xs, plans)]  # (rows out, d_model) each

        def dispatch(i, async_op):
            return comm.all_to_all_single(sends[i], plans[i].rows_to, plans[i].rows_from, group=group,
                                          async_op=async_op)

        def run_experts(i, received):
            with probe.span("experts", kind="compute", rows=received.shape[0]):
                return local_expert_rows(received, plans[i].got, experts)

        def combine(i, out, async_op):
            return comm.all_to_all_single(out, plans[i].rows_from, plans[i].rows_to, group=group, async_op=async_op)

        if not overlap:  # A, then B: every all-to-all exposed
            return [weighted_at_home(combine(i, run_experts(i, dispatch(i, False)), False), plans[i], cfg)
                    for i in (0, 1)]
        received_a = dispatch(0, True).wait()  # exposed: nothing to compute yet
        flying_b = dispatch(1, True)  # B's rows in flight ...
        out_a = run_experts(0, received_a)  # ... under A's experts
        received_b = flying_b.wait()
        flying_a = combine(0, out_a, True)  # A's results in flight ...
        out_b = run_experts(1, received_b)  # ... under B's experts
        back_a = flying_a.wait()
        flying_b = combine(1, out_b, True)  # exposed, but for A's weighted sum
        y_a = weighted_at_home(back_a, plans[0], cfg)
        return [y_a, weighted_at_home(flying_b.wait(), plans[1], cfg)]
