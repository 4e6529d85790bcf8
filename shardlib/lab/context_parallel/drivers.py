"""Context parallelism run on a pool, against the unsharded attention, the work count and the cost model.

``run_ring_attention`` (the ring's output, gap, compute, step time, transfers), ``run_ring_balance``
(contiguous and zigzag placements side by side), ``run_ring_overlap`` (with and without overlap against
alpha-beta on the link ``run_exchange_calibration`` fits), ``run_ulysses_attention`` and
``run_all_gather_attention``, forward only (the backward's drivers are in ``grad_drivers``). Inputs are
checked here, before any rank starts; the rank functions check again.

The timing claims of notebook 10, as verdicts, are in ``claims``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import TOLERANCE, flag, number_at_least, whole_number
from shardlib.core.context_parallel.all_gather import check_all_gather_inputs
from shardlib.core.context_parallel.online_softmax import attention_reference
from shardlib.core.context_parallel.placement import PLACEMENTS, RankWork, causal_work, imbalance
from shardlib.core.context_parallel.ring import check_ring_inputs
from shardlib.core.context_parallel.ulysses import check_ulysses_inputs
from shardlib.facts.hardware import Link
from shardlib.lab.context_parallel.ranks import (
    all_gather_attention_on_rank,
    exchange_sweep_on_rank,
    ring_attention_on_rank,
    ulysses_attention_on_rank,
)
from shardlib.lab.context_parallel.reference import gather_sequence
from shardlib.lab.harness import on_ranks
from shardlib.predict.calibration import fastest_of_slowest, fit_link
from shardlib.predict.context_parallel import (
    AttentionShape,
    all_gather_kv_collectives,
    hidden_share,
    ring_time_s,
    ring_transfer_s,
    ulysses_collectives,
)
from shardlib.runtime.timeline import Span


def _gap(out: torch.Tensor, q, k, v, causal: bool, scale) -> float:
    return float((out - attention_reference(q, k, v, causal, scale)).abs().max())


def attention_shape(q: torch.Tensor, k: torch.Tensor) -> AttentionShape:
    b, heads, seq, hd = q.shape
    return AttentionShape(b, heads, k.shape[1], seq, hd, q.element_size())


def _median_of_slowest(got, key: str) -> float:
    """Per run, the slowest rank's value; then the median over the runs (noise on a shared machine only
    ever adds time, so no single run decides)."""
    return statistics.median(got.across(key, max))


@dataclass(frozen=True)
class RingRun:
    """One ring pass on a pool, run ``repeats`` times: the gathered ``output`` and its ``gap`` from the
    whole-sequence attention, and (medians over the runs) per rank its compute (``compute_s``, wall
    time, and ``compute_cpu_s``, its thread's CPU time: what a busy machine does not inflate), per step
    the slowest rank's compute, the slowest rank's whole pass (``step_s``), time blocked waiting for
    transfers (``waited_s``) and the transfers' time from issue to completion (``transfer_s``).
    ``blocks`` and ``transfers`` are each rank's of the last run."""

    world_size: int
    placement: str
    causal: bool
    overlap: bool
    output: torch.Tensor = field(repr=False)
    gap: float
    compute_s: tuple[float, ...]
    compute_cpu_s: tuple[float, ...]
    step_compute_s: tuple[float, ...]
    step_s: float
    waited_s: float
    transfer_s: float
    blocks: tuple[tuple, ...]
    transfers: tuple[tuple, ...]
    predicted_work: tuple[RankWork, ...]
    spans: tuple[Span, ...] = field(default=(), repr=False)

    @property
    def exact(self) -> bool:
        return self.gap <= TOLERANCE

    @property
    def computed_blocks(self) -> tuple[int, ...]:
        """Blocks each rank computed, read from its spans (the prediction is ``predicted_work``)."""
        return tuple(sum(vis + diag for _, vis, diag in steps) for steps in self.blocks)

    @property
    def sent_bytes_per_rank(self) -> tuple[int, ...]:
        return tuple(sum(wire for op, _, wire, _, _ in t if op == "send") for t in self.transfers)

    @property
    def compute_imbalance(self) -> float:
        """The busiest rank's compute (CPU time) over the mean (1: even)."""
        return max(self.compute_cpu_s) * len(self.compute_cpu_s) / sum(self.compute_cpu_s)


def run_ring_attention(ranks, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                       placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                       repeats: int = 1, pad_compute_s: float | None = None) -> RingRun:
    """``ring.ring_attention`` on every rank of ``ranks``: each takes its shard of the whole ``q, k, v``
    (``q (b, H, s, hd)``, ``k, v (b, KV, s, hd)``) in ``placement``; run ``repeats`` times, each step's
    compute padded to ``pad_compute_s`` if given."""
    n = ranks.world_size
    check_ring_inputs(q.shape, k.shape, v.shape, n, placement, local=False)
    flag(causal, "causal")
    flag(overlap, "overlap")
    if pad_compute_s is not None:
        number_at_least(pad_compute_s, "pad_compute_s")
    got = on_ranks(ranks, ring_attention_on_rank, q, k, v, causal, placement, overlap, scale,
                           whole_number(repeats, "repeats"), pad_compute_s)
    out = gather_sequence(list(got.each("output")), placement)
    compute, cpu = (got.each(key, lambda runs: statistics.median(sum(steps) for steps in runs))
                    for key in ("step_compute_s", "step_cpu_s"))
    slowest_per_step = got.across("step_compute_s", lambda ranks_steps: [max(s) for s in zip(*ranks_steps)])
    per_step = tuple(statistics.median(run[step] for run in slowest_per_step) for step in range(n))
    return RingRun(n, placement, causal, overlap, out, _gap(out, q, k, v, causal, scale), compute, cpu, per_step,
                   _median_of_slowest(got, "times_s"), _median_of_slowest(got, "waited_s"),
                   _median_of_slowest(got, "transfer_s"), got.each("blocks"), got.each("transfers"),
                   tuple(causal_work(q.shape[2], n, placement, causal)), tuple(ranks.last_spans))


@dataclass(frozen=True)
class Balance:
    """The same causal ring in each placement, ``runs[placement]``: per-rank compute measured (CPU time,
    medians over the repeats) against the blocks predicted."""

    runs: dict

    def compute_s(self, placement: str) -> tuple[float, ...]:
        return self.runs[placement].compute_cpu_s

    def measured_imbalance(self, placement: str) -> float:
        return self.runs[placement].compute_imbalance

    def predicted_imbalance(self, placement: str) -> float:
        return imbalance(self.runs[placement].predicted_work)


def run_ring_balance(ranks, q, k, v, repeats: int = 3, scale: float | None = None) -> Balance:
    """Causal ring attention in the contiguous and the zigzag placement, ``repeats`` passes each."""
    for placement in PLACEMENTS:
        check_ring_inputs(q.shape, k.shape, v.shape, ranks.world_size, placement, local=False)
    return Balance({placement: run_ring_attention(ranks, q, k, v, True, placement, True, scale, repeats)
                    for placement in PLACEMENTS})


@dataclass(frozen=True)
class Overlap:
    """The ring with and without overlap (median step times over repeats), the alpha-beta prediction
    of each from the measured compute and ``link``, and the share of the transfer hidden."""

    overlapped: RingRun
    sequential: RingRun
    link: Link
    transfer_s: float  # one block over ``link``, predicted

    @property
    def predicted_overlapped_s(self) -> float:
        """``predict.ring_time_s`` from the per-step compute this run measured (on a shared machine
        compute varies from run to run more than the transfer does) and ``transfer_s``."""
        return ring_time_s(self.overlapped.step_compute_s, self.transfer_s, overlap=True)

    @property
    def predicted_sequential_s(self) -> float:
        return ring_time_s(self.sequential.step_compute_s, self.transfer_s, overlap=False)

    @property
    def hidden_share(self) -> float:
        """1 minus the wait left with overlap over the transfer time without it."""
        return hidden_share(self.overlapped.waited_s, self.sequential.transfer_s)


@dataclass(frozen=True)
class ExchangeCalibration:
    """This machine's link as the ring uses it, fitted to exchanges of ``sizes_bytes`` (``rounds`` each)."""

    link: Link
    sizes_bytes: tuple[int, ...]
    rounds: int


def run_exchange_calibration(ranks, block_bytes: float, rounds: int = 5) -> ExchangeCalibration:
    """Every rank sending to the next while receiving from the previous, fitted by
    ``predict.calibration.fit_link`` to exchanges from 1/256 of ``block_bytes`` up to all of it, the fastest
    of ``rounds`` rounds each. A sweep too noisy to fit (times that do not grow with size, on a busy
    machine) is measured once more with twice the rounds."""
    sizes = tuple(sorted({max(64, int(block_bytes / f) // 64 * 64) for f in (256, 64, 16, 4, 1)}))
    for attempt in (1, 2):
        used = whole_number(rounds, "rounds") * attempt
        per_rank = ranks.run(exchange_sweep_on_rank, sizes, used)
        try:
            fit = fit_link(fastest_of_slowest(per_rank, ranks.world_size))
            break
        except ValueError:
            if attempt == 2:
                raise
    link = fit.link(f"this machine, ring exchange ({ranks.backend}, {ranks.world_size} ranks)")
    return ExchangeCalibration(link, sizes, used)


def run_ring_overlap(ranks, q, k, v, causal: bool = True, placement: str = "contiguous", repeats: int = 5,
                     link: Link | None = None, scale: float | None = None,
                     pad_compute_s: float | None = None) -> Overlap:
    """The ring with overlap and without, ``repeats`` passes each, against the prediction. ``link``:
    the link to predict with (default: this machine's, fitted now by ``run_exchange_calibration``);
    ``pad_compute_s``: each step's compute padded to a set length (see ``ranks.RingProbe``)."""
    check_ring_inputs(q.shape, k.shape, v.shape, ranks.world_size, placement, local=False)
    shape = attention_shape(q, k)
    if link is None:
        link = run_exchange_calibration(ranks, shape.kv_block_bytes(ranks.world_size)).link
    runs = {ov: run_ring_attention(ranks, q, k, v, causal, placement, ov, scale, repeats, pad_compute_s)
            for ov in (False, True)}
    return Overlap(runs[True], runs[False], link, ring_transfer_s(shape, ranks.world_size, link))


@dataclass(frozen=True)
class UlyssesRun:
    """The all-to-all method on a pool: gathered output, gap, and rank 0's collectives measured and
    predicted (``(op, size_bytes, wire_bytes)`` each)."""

    world_size: int
    output: torch.Tensor = field(repr=False)
    gap: float
    measured: tuple[tuple, ...]
    predicted: tuple[tuple, ...]

    @property
    def wire_bytes_per_rank(self) -> int:
        return sum(wire for _, _, wire in self.measured)


def run_ulysses_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None) -> UlyssesRun:
    """``ulysses.ulysses_attention`` on every rank (contiguous shards), against the whole-sequence attention."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ranks.world_size, local=False)
    flag(causal, "causal")
    got = on_ranks(ranks, ulysses_attention_on_rank, q, k, v, causal, scale)
    out = got.cat("output", dim=2)
    predicted = tuple((op, int(size), int(round(wire))) for op, size, wire in
                      ulysses_collectives(attention_shape(q, k), ranks.world_size))
    return UlyssesRun(ranks.world_size, out, _gap(out, q, k, v, causal, scale), got.first("collectives"), predicted)


def run_all_gather_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None) -> UlyssesRun:
    """``all_gather.all_gather_kv_attention`` on every rank (contiguous shards), against the whole-sequence
    attention; ``measured`` is rank 0's comm log, ``predicted`` ``predict.all_gather_kv_collectives``."""
    check_all_gather_inputs(q.shape, k.shape, v.shape, ranks.world_size, local=False)
    flag(causal, "causal")
    got = on_ranks(ranks, all_gather_attention_on_rank, q, k, v, causal, scale)
    out = got.cat("output", dim=2)
    predicted = tuple((op, int(size), int(round(wire))) for op, size, wire in
                      all_gather_kv_collectives(attention_shape(q, k), ranks.world_size))
    return UlyssesRun(ranks.world_size, out, _gap(out, q, k, v, causal, scale), got.first("collectives"), predicted)
