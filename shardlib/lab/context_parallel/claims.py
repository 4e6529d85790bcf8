"""Notebook 10's timing claims as verdicts (``lab.verdict``): zigzag's balance and the ring's overlap.

``run_balance_check`` and ``run_ring_overlap_check`` return ``(result, verdicts)``: the drivers' result
whose verdicts held (or the last attempt's) and the verdicts themselves.
"""

from __future__ import annotations

from shardlib.lab.context_parallel.drivers import Balance, Overlap, run_ring_balance, run_ring_overlap
from shardlib.lab.verdict import Verdict, verified

ZIGZAG_HIGH = 4 / 3  # zigzag's imbalance over contiguous's, measured over predicted (3/4): at most 1, as claimed
RING_OVERLAP_BAND = (0.95, 1.35)  # each ring's step time over its alpha-beta prediction; the Python between steps adds
HIDDEN_AT_LEAST = 0.5  # the share of the transfer hidden under compute, overlapped


def balance_verdicts(balance: Balance) -> tuple[Verdict, ...]:
    """One verdict: the busiest rank over the mean, zigzag's over contiguous's (CPU time). Predicted from
    the blocks each rank computes (``placement.causal_work``); it holds when the measured ratio is at most
    1 (zigzag evens the work), i.e. measured / predicted at most ``ZIGZAG_HIGH``."""
    predicted = balance.predicted_imbalance("zigzag") / balance.predicted_imbalance("contiguous")
    measured = balance.measured_imbalance("zigzag") / balance.measured_imbalance("contiguous")
    return (Verdict("busiest rank over the mean, zigzag / contiguous", predicted, measured, unit="",
                    low=0.5, high=1 / predicted if predicted < 1 else ZIGZAG_HIGH),)


def run_balance_check(ranks, q, k, v, repeats: int = 3) -> tuple[Balance, tuple[Verdict, ...]]:
    """The causal ring in both placements (``run_ring_balance``), measured until zigzag evens the work, at
    most three times. Each rank's compute is its thread's CPU time, the median of ``repeats`` passes."""
    return verified(lambda: run_ring_balance(ranks, q, k, v, repeats=repeats), balance_verdicts)


def overlap_verdicts(o: Overlap) -> tuple[Verdict, ...]:
    """Three verdicts: each ring's step time against its alpha-beta prediction (within ``RING_OVERLAP_BAND``),
    and the share of the transfer hidden, predicted whole, held from ``HIDDEN_AT_LEAST``. A ring that
    blocked longer overlapped than not counts as nothing hidden."""
    low, high = RING_OVERLAP_BAND
    hidden = o.hidden_share if o.overlapped.waited_s < o.sequential.waited_s else 0.0
    return (Verdict("ring pass, overlapped", o.predicted_overlapped_s, o.overlapped.step_s, "s", low, high),
            Verdict("ring pass, one after the other", o.predicted_sequential_s, o.sequential.step_s, "s", low, high),
            Verdict("share of the transfer hidden", 1.0, max(hidden, 1e-9), "%", HIDDEN_AT_LEAST, 1.0))


def run_ring_overlap_check(ranks, q, k, v, repeats: int = 3,
                           pad_compute_s: float | None = 0.04) -> tuple[Overlap, tuple[Verdict, ...]]:
    """The ring with and without overlap (``run_ring_overlap``, the link fitted here each attempt, each
    step's compute padded to ``pad_compute_s``), measured until its verdicts hold, at most three times."""
    return verified(lambda: run_ring_overlap(ranks, q, k, v, repeats=repeats, pad_compute_s=pad_compute_s),
                    overlap_verdicts)
