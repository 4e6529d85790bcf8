"""Expert parallelism on a rank: ``dispatch.expert_parallel_moe`` with its timing attached.

``ep_forward_on_rank`` runs the layer ``repeats`` times after a barrier each, through a probe that
records each phase on the rank's timeline and times the expert FFNs (wall clock and CPU time, optionally
padded by a sleep per row), and reads the all-to-alls' bytes and durations from the comm log.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from ..runtime.timeline import now_s
from .balance import split_groups
from .dispatch import expert_parallel_moe
from .placement import ExpertPlacement
from .reference import MoEWeights, check_layer_inputs
from .routing import MoEConfig


class _ExpertTimer:
    """A probe: every phase a span on ``timeline``; the expert FFNs also timed by the wall clock and by
    CPU time, then padded by ``extra_s_per_row`` seconds per row received."""

    def __init__(self, timeline, extra_s_per_row: float) -> None:
        self.timeline = timeline
        self.extra_s_per_row = extra_s_per_row
        self.start_s = self.end_s = self.cpu_s = 0.0

    def span(self, name: str, kind: str = "compute", **attrs):
        if name == "experts":
            return self._experts(kind, attrs)
        return self.timeline.span(name, kind, **attrs)

    @contextmanager
    def _experts(self, kind: str, attrs: dict):
        with self.timeline.span("experts", kind, **attrs):
            start_s, cpu_start_s = now_s(), time.process_time()
            yield
            self.cpu_s = time.process_time() - cpu_start_s  # work done, whatever else shares the cores
            if self.extra_s_per_row:
                time.sleep(attrs["rows"] * self.extra_s_per_row)
            self.start_s, self.end_s = start_s, now_s()


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
    timer = _ExpertTimer(ctx.timeline, extra_s_per_row)
    result = {"forward_s": [], "expert_s": [], "expert_cpu_s": [], "start_s": [], "end_s": [], "expert_end_s": []}
    for _ in range(repeats):
        ctx.comm.barrier()
        first_record = len(ctx.comm.records)
        t0 = now_s()
        forward = expert_parallel_moe(ctx, x_home, weights, cfg, placement, probe=timer)
        t1 = now_s()
        for key, value in (("forward_s", t1 - t0), ("expert_s", timer.end_s - timer.start_s), ("start_s", t0),
                           ("end_s", t1), ("expert_end_s", timer.end_s), ("expert_cpu_s", timer.cpu_s)):
            result[key].append(value)
    counts_rec, tokens_rec, back_rec = [r for r in ctx.comm.records[first_record:] if r.op == "all_to_all_single"]
    assignment, hosted = forward.assignment, placement.hosted(ctx.rank)
    result.update(
        output=forward.output, rows_to_rank=forward.rows_to_rank, rows_from_rank=forward.rows_from_rank,
        expert_rows=sum(forward.rows_from_rank), expert_counts=assignment.counts(cfg.n_experts),
        dropped_slots=assignment.dropped_slots, dropped_tokens=assignment.dropped_tokens,
        rerouted_slots=assignment.rerouted_slots, capacity=assignment.capacity,
        counts_bytes=counts_rec.size_bytes, dispatch_bytes=tokens_rec.size_bytes, combine_bytes=back_rec.size_bytes,
        rows_wire_bytes=tokens_rec.wire_bytes + back_rec.wire_bytes, dispatch_s=tokens_rec.duration_s,
        combine_s=back_rec.duration_s,
        weight_bytes=sum(w[e].numel() * w.element_size() for e in hosted  # the expert weights this rank ran:
                         for w in (weights.gate, weights.up, weights.down)),  # what it must hold (it was sent all)
    )
    return result
