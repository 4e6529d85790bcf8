"""Expert parallelism on a rank: ``dispatch.expert_parallel_moe`` with its timing attached.

``overlap_on_rank`` runs two microbatches through the layer in turn or overlapped, over an emulated slow
link, with the expert phase padded; it reads the exposed all-to-all time from the comm log.
``ep_forward_on_rank`` runs the layer ``repeats`` times after a barrier each, through a probe that
records each phase on the rank's timeline and times the expert FFNs (wall clock and CPU time, optionally
padded by a sleep per row), and reads the all-to-alls' bytes and durations from the comm log.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from shardlib.core.experts.balance import split_groups
from shardlib.core.experts.dispatch import MoEWeights, expert_parallel_moe
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.reference import check_layer_inputs
from shardlib.runtime.timeline import now_s


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


@dataclass(frozen=True)
class EPForwardResult:
    """One rank's expert-parallel forwards: its output rows and routing (the last repeat's), the bytes of
    its three all-to-alls, and per repeat its times (seconds, on the clock the ranks share)."""

    output: torch.Tensor  # (T_r, d_model), this rank's home rows
    rows_to_rank: list[int]  # (ep,) rows this rank sent to each rank, itself included
    expert_rows: int  # rows this rank's experts computed
    expert_counts: torch.Tensor  # (n_experts,) token-slots this rank's tokens sent to each expert
    dropped_slots: int
    dropped_tokens: int
    rerouted_slots: int
    capacity: int | None  # per expert per rank
    counts_bytes: int  # the counts all-to-all (what this rank sent)
    dispatch_bytes: int  # the token rows all-to-all
    combine_bytes: int  # the rows back
    rows_wire_bytes: int  # token rows sent to other ranks, dispatch and combine
    weight_bytes: int  # the expert weights this rank ran: what it must hold (it was sent all)
    forward_s: list[float]  # per repeat
    expert_s: list[float]  # per repeat, wall clock of the expert FFNs (the padding sleep included)
    expert_cpu_s: list[float]  # per repeat, CPU time of the FFNs
    start_s: list[float]  # per repeat: the forward's start, expert end and end
    expert_end_s: list[float]
    end_s: list[float]


def ep_forward_on_rank(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       repeats: int = 1, extra_s_per_row: float = 0.0) -> EPForwardResult:
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
    times = []  # per repeat: (start, expert start, expert end, end, expert CPU seconds)
    for _ in range(repeats):
        ctx.comm.barrier()
        first_record = len(ctx.comm.records)
        t0 = now_s()
        forward = expert_parallel_moe(ctx, x_home, weights, cfg, placement, probe=timer)
        times.append((t0, timer.start_s, timer.end_s, now_s(), timer.cpu_s))
    counts_rec, tokens_rec, back_rec = [r for r in ctx.comm.records[first_record:] if r.op == "all_to_all_single"]
    assignment, hosted = forward.assignment, placement.hosted(ctx.rank)
    return EPForwardResult(
        output=forward.output, rows_to_rank=forward.rows_to_rank, expert_rows=sum(forward.rows_from_rank),
        expert_counts=assignment.counts(cfg.n_experts), dropped_slots=assignment.dropped_slots,
        dropped_tokens=assignment.dropped_tokens, rerouted_slots=assignment.rerouted_slots,
        capacity=assignment.capacity, counts_bytes=counts_rec.size_bytes, dispatch_bytes=tokens_rec.size_bytes,
        combine_bytes=back_rec.size_bytes, rows_wire_bytes=tokens_rec.wire_bytes + back_rec.wire_bytes,
        weight_bytes=sum(w[e].numel() * w.element_size() for e in hosted
                         for w in (weights.gate, weights.up, weights.down)),
        forward_s=[end - t0 for t0, _, _, end, _ in times], expert_s=[e1 - e0 for _, e0, e1, _, _ in times],
        expert_cpu_s=[cpu for *_, cpu in times], start_s=[t[0] for t in times], expert_end_s=[t[2] for t in times],
        end_s=[t[3] for t in times])


# -- two microbatches, in turn or overlapped ---------------------------------------------------------------------
class _PaddedExperts:
    """A probe: every phase a span on ``timeline``; the expert phase padded by a sleep to at least
    ``expert_s`` seconds, a stand-in for an accelerator's expert GEMMs (the sleep leaves the cores to the
    communication, as a GPU's kernels would)."""

    def __init__(self, timeline, expert_s: float) -> None:
        self.timeline, self.expert_s = timeline, expert_s

    def span(self, name: str, kind: str = "compute", **attrs):
        if name == "experts":
            return self._experts(kind, attrs)
        return self.timeline.span(name, kind, **attrs)

    @contextmanager
    def _experts(self, kind: str, attrs: dict):
        with self.timeline.span("experts", kind, **attrs):
            start_s = now_s()
            yield
            left_s = start_s + self.expert_s - now_s()
            if left_s > 0:
                time.sleep(left_s)


@dataclass(frozen=True)
class OverlapResult:
    """One rank's two-microbatch forwards: the outputs (the last repeat's), the bytes of its all-to-alls
    in the order issued (counts A, counts B, then the rows: dispatch A, dispatch B, combine A, combine B
    whatever the order they ran in), and per repeat the seconds it was blocked in them."""

    outputs: list  # [microbatch] (T_mb, d_model)
    counts_bytes: list[int]
    rows_bytes: list[int]
    exposed_s: list[float]  # per repeat
    forward_s: list[float]


def overlap_on_rank(ctx, x: torch.Tensor, weights, cfg, overlap: bool, expert_s: float, link,
                    repeats: int = 3) -> OverlapResult:
    """``overlap.moe_two_microbatches`` on this rank's share of ``x`` (halved into two microbatches, after
    the input projection), experts spread over every rank, each rank on its own emulated node joined by
    ``link`` (a ``hardware.Link``: each all-to-all lasts as the alpha-beta model prices it there), the
    expert phase padded to ``expert_s``, after one warm-up forward. Exposed time: a blocking call's
    duration, an asynchronous one's ``waited_s``."""
    from shardlib.core.experts.overlap import moe_two_microbatches
    from shardlib.lab.costs.emulation import EmulatedLink
    from shardlib.lab.experts.train_step import local_experts, project

    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    h = project(x[start:stop], weights.w_in)  # (T_r, d_model)
    xs = list(torch.tensor_split(h, 2))  # two microbatches of this rank's tokens
    experts = local_experts(weights, ctx.rank, cfg.experts_per_rank(ctx.world_size))
    probe = _PaddedExperts(ctx.timeline, expert_s)
    exposed, forwards = [], []
    moe_two_microbatches(ctx, xs, experts, weights.router, cfg, overlap=overlap)  # warm-up, not measured
    ctx.comm.emulate(EmulatedLink(tuple(range(ctx.world_size)), link))
    try:
        for _ in range(repeats):
            ctx.comm.barrier()
            first = len(ctx.comm.records)
            t0 = now_s()
            outputs = moe_two_microbatches(ctx, xs, experts, weights.router, cfg, overlap=overlap, probe=probe)
            forwards.append(now_s() - t0)
            calls = [r for r in ctx.comm.records[first:] if r.op == "all_to_all_single"]
            exposed.append(sum(r.duration_s if r.waited_s is None else r.waited_s for r in calls))
    finally:
        ctx.comm.emulate(None)
    sizes = [r.size_bytes for r in calls]  # logged as each finished: overlapped, dispatch A, B, combine A, B
    rows = [sizes[2], sizes[4], sizes[3], sizes[5]] if not overlap else sizes[2:]  # in turn: A's two, then B's
    return OverlapResult(outputs, sizes[:2], rows, exposed, forwards)
