"""Expert parallelism's rank functions: the core layer on this rank's share of the batch, with a probe that
times the expert phase. ``lab.harness.on_ranks`` runs them and gathers what they returned and sent.

``ep_forward_on_rank`` is one forward of ``dispatch.moe_layer``; ``overlap_on_rank`` is
``overlap.moe_two_microbatches`` over an emulated slow link. Their probe records the expert phase as a
span with its CPU seconds, optionally padded by a sleep: per row received (a stall that survives a noisy
machine) or to a floor (a stand-in for an accelerator's expert GEMMs; the sleep leaves the cores to the
communication, as a GPU's kernels would).
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from shardlib.core.experts.balance import split_groups
from shardlib.core.experts.dispatch import MoEWeights, moe_layer
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig, check_tokens
from shardlib.runtime.timeline import now_s


class ExpertTimer:
    """A probe: every phase a span on ``timeline``; the ``experts`` span also carries ``cpu_s`` (CPU time,
    which other programs on the machine do not inflate) and lasts at least ``rows * extra_s_per_row``
    more than the FFNs, and at least ``floor_s`` in all."""

    def __init__(self, timeline, extra_s_per_row: float = 0.0, floor_s: float = 0.0) -> None:
        self.timeline, self.extra_s_per_row, self.floor_s = timeline, extra_s_per_row, floor_s

    def span(self, name: str, kind: str = "compute", **attrs):
        return self._experts(kind, attrs) if name == "experts" else self.timeline.span(name, kind, **attrs)

    @contextmanager
    def _experts(self, kind: str, attrs: dict):
        start_s, cpu_start_s = now_s(), time.process_time()
        yield
        cpu_s = time.process_time() - cpu_start_s
        pad_s = max(attrs.get("rows", 0) * self.extra_s_per_row, start_s + self.floor_s - now_s())
        if pad_s > 0:
            time.sleep(pad_s)
        self.timeline.record("experts", start_s, now_s(), kind, cpu_s=cpu_s, **attrs)


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


def ep_forward_on_rank(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       extra_s_per_row: float = 0.0) -> dict:
    """One expert-parallel forward of this rank's contiguous share of ``x`` (the whole batch): the output with
    its residual, the assignment, the rows sent to and received from each rank. Each rank is sent every
    expert's weights and uses only those it hosts; a deployment would load only those."""
    check_layer_inputs(x, weights, cfg, placement, ctx.world_size)
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    home = x[start:stop].to(ctx.device)  # (T_r, d_model)
    out = moe_layer(home, weights.router, weights.experts(placement.hosted(ctx.rank)), cfg, ctx=ctx,
                    placement=placement, probe=ExpertTimer(ctx.timeline, extra_s_per_row))
    return {"output": home + out.output, "assignment": out.assignment, "rows_to_rank": out.rows_to_rank,
            "rows_from_rank": out.rows_from_rank}


def overlap_on_rank(ctx, x: torch.Tensor, weights, cfg, overlap: bool, expert_s: float, link) -> list:
    """``overlap.moe_two_microbatches`` on this rank's share of ``x`` (halved into two microbatches, after
    the input projection), experts spread over every rank, each rank on its own emulated node joined by
    ``link`` (a ``hardware.Link``: each all-to-all lasts as the alpha-beta model prices it there), the
    expert phase padded to ``expert_s``. Returns the two microbatches' outputs."""
    from shardlib.core.experts.overlap import moe_two_microbatches
    from shardlib.lab.costs.emulation import EmulatedLink
    from shardlib.lab.experts.training import project

    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    xs = list(torch.tensor_split(project(x[start:stop], weights.w_in), 2))  # two microbatches, (T_r / 2, d_model)
    n_local = cfg.experts_per_rank(ctx.world_size)
    experts = weights.experts(range(ctx.rank * n_local, (ctx.rank + 1) * n_local))
    ctx.comm.emulate(EmulatedLink(tuple(range(ctx.world_size)), link))
    try:
        return moe_two_microbatches(ctx, xs, experts, weights.router, cfg, overlap=overlap,
                                    probe=ExpertTimer(ctx.timeline, floor_s=expert_s))
    finally:
        ctx.comm.emulate(None)
