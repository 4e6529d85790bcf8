"""Notebook 10's timing claims as verdicts (``lab.verdict``): zigzag's balance and the ring's overlap.

``run_ring_balance`` sets the two placements side by side, ``run_ring_overlap`` the ring with and without
overlap against alpha-beta on the link ``run_exchange_calibration`` fits; ``balance_verdicts`` and
``overlap_verdicts`` are their claims. Measure until a claim holds with
``lab.verdict.verified(lambda: run_x(...), x_verdicts)`` (each rank's compute is its thread's CPU time,
the median of ``repeats`` passes).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import whole_number
from shardlib.core.context_parallel.online_softmax import check_shards
from shardlib.core.context_parallel.placement import PLACEMENTS
from shardlib.core.context_parallel.ring import Hop
from shardlib.facts.hardware import Link
from shardlib.lab.context_parallel.drivers import AttentionRun, attention_shape, run_ring_attention
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, refitted
from shardlib.predict.alpha_beta import fit_link, slowest_samples
from shardlib.predict.context_parallel import hidden_share, ring_time_s, ring_transfer_s

ZIGZAG_HIGH = 4 / 3  # zigzag's imbalance over contiguous's, measured over predicted (3/4): at most 1, as claimed
RING_OVERLAP_BAND = (0.95, 1.35)  # each ring's step time over its alpha-beta prediction; the Python between steps adds
HIDDEN_AT_LEAST = 0.5  # the share of the transfer hidden under compute, overlapped


def run_ring_balance(ranks, q, k, v, repeats: int = 3, scale: float | None = None) -> dict[str, AttentionRun]:
    """Causal ring attention in the contiguous and the zigzag placement, ``repeats`` passes each, by placement:
    per-rank CPU time against the blocks."""
    for placement in PLACEMENTS:
        check_shards(q.shape, k.shape, v.shape, ranks.world_size, placement)
    return {placement: run_ring_attention(ranks, q, k, v, True, placement, True, scale, repeats)
            for placement in PLACEMENTS}


@dataclass(frozen=True)
class Overlap:
    """The ring with and without overlap, each against alpha-beta on ``link``, and the transfer hidden."""

    overlapped: AttentionRun
    sequential: AttentionRun
    link: Link
    transfer_s: float  # one block over ``link``, predicted

    @property
    def predicted_overlapped_s(self) -> float:
        """``predict.ring_time_s`` from the per-step compute this run measured and ``transfer_s``."""
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


def exchange_on_rank(ctx, size_bytes: int) -> None:
    """One ``ring.Hop``: ``size_bytes`` to the next rank while as many arrive from the previous."""
    Hop(ctx, torch.ones(int(size_bytes) // 4, device=ctx.device)).wait()  # (size / 4,) float32


def _exchange_s(got: Measured, rank: int, repeat: int) -> float:
    """From the rank's send's start to the later of its send's and its receive's completion."""
    calls = got.records(None, rank, repeat)
    return max(c.start_s + c.duration_s for c in calls) - min(c.start_s for c in calls)


def run_exchange_calibration(ranks, block_bytes: float, rounds: int = 5) -> ExchangeCalibration:
    """``predict.fit_link`` to ring exchanges (``exchange_on_rank``) from 1/256 of ``block_bytes`` to
    all of it, the fastest of ``rounds`` each after a warm-up; a sweep too noisy to fit, once more with
    twice the rounds."""
    sizes = tuple(sorted({max(64, int(block_bytes / f) // 64 * 64) for f in (256, 64, 16, 4, 1)}))
    n = ranks.world_size
    whole_number(rounds, "rounds")

    def fit(attempt: int) -> ExchangeCalibration:
        used = rounds * attempt
        per_rank = [{} for _ in range(n)]  # {("point_to_point", size): [seconds per round]}
        for size in sizes:
            got = on_ranks(ranks, exchange_on_rank, size, repeats=used + 1)  # the first, a warm-up
            for rank in range(n):
                per_rank[rank]["point_to_point", size] = [_exchange_s(got, rank, i) for i in range(1, used + 1)]
        link = fit_link(slowest_samples(per_rank, n)).link(f"this machine, ring exchange ({ranks.backend}, {n} ranks)")
        return ExchangeCalibration(link, sizes, used)

    return refitted(fit, attempts=2)


def run_ring_overlap(ranks, q, k, v, causal: bool = True, placement: str = "contiguous", repeats: int = 5,
                     link: Link | None = None, scale: float | None = None,
                     pad_compute_s: float | None = None) -> Overlap:
    """The ring with overlap and without, ``repeats`` passes each, against the prediction on ``link``
    (default: this machine's, fitted now by ``run_exchange_calibration``)."""
    check_shards(q.shape, k.shape, v.shape, ranks.world_size, placement)
    shape = attention_shape(q, k)
    if link is None:
        link = run_exchange_calibration(ranks, shape.kv_block_bytes(ranks.world_size)).link
    runs = {ov: run_ring_attention(ranks, q, k, v, causal, placement, ov, scale, repeats, pad_compute_s)
            for ov in (False, True)}
    return Overlap(runs[True], runs[False], link, ring_transfer_s(shape, ranks.world_size, link))


def balance_verdicts(balance: dict[str, AttentionRun]) -> tuple[Verdict, ...]:
    """One verdict: the busiest rank over the mean, zigzag's over contiguous's (CPU time). Predicted from
    the blocks each rank computes (``placement.causal_work``); it holds when the measured ratio is at most
    1 (zigzag evens the work), i.e. measured / predicted at most ``ZIGZAG_HIGH``."""
    predicted = balance["zigzag"].predicted_imbalance / balance["contiguous"].predicted_imbalance
    measured = balance["zigzag"].measured_imbalance / balance["contiguous"].measured_imbalance
    return (Verdict("busiest rank over the mean, zigzag / contiguous", predicted, measured, unit="",
                    low=0.5, high=1 / predicted if predicted < 1 else ZIGZAG_HIGH),)


def overlap_verdicts(o: Overlap) -> tuple[Verdict, ...]:
    """Three verdicts: each ring's step time against its alpha-beta prediction (within ``RING_OVERLAP_BAND``),
    and the share of the transfer hidden, predicted whole, held from ``HIDDEN_AT_LEAST``. A ring that
    blocked longer overlapped than not counts as nothing hidden."""
    low, high = RING_OVERLAP_BAND
    hidden = o.hidden_share if o.overlapped.waited_s < o.sequential.waited_s else 0.0
    return (Verdict("ring pass, overlapped", o.predicted_overlapped_s, o.overlapped.step_s, "s", low, high),
            Verdict("ring pass, one after the other", o.predicted_sequential_s, o.sequential.step_s, "s", low, high),
            Verdict("share of the transfer hidden", 1.0, max(hidden, 1e-9), "%", HIDDEN_AT_LEAST, 1.0))

