"""Notebook 08's measured claims (the collective identity, the overlap), each one line: predicted, measured,
ratio, verdict (``lab.verdict``).
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.lab.data_parallel.drivers import (
    CollectiveIdentity,
    OverlapComparison,
    run_collective_identity,
    run_overlap,
)
from shardlib.lab.verdict import Verdict, verified

IDENTITY_BAND = (0.5, 2.0)  # all-reduce time / its prediction from the pair's time and passes
BUCKET_OVERLAP_BAND = (0.5, 2.0)  # step with overlap / step without, on ranks that share their cores with the transfers


PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # ring passes of (n-1)/n over the buffer
GLOO_PASSES = {**PASSES, "reduce_scatter": 2, "all_gather": 2}  # gloo builds both on an all-reduce of the whole buffer


def pair_passes(backend: str) -> int:
    """Ring passes a reduce-scatter and an all-gather of one buffer make together on ``backend``: 2 on
    NCCL (the all-reduce's two halves), 4 on gloo (which builds both on an all-reduce of the whole buffer)."""
    passes = GLOO_PASSES if backend == "gloo" else PASSES
    return passes["reduce_scatter"] + passes["all_gather"]


@dataclass(frozen=True)
class IdentityCheck:
    """``run_collective_identity`` with its one timing claim. The bytes are the same, so the all-reduce
    takes the pair's time scaled by their passes over the buffer: ``2 / pair_passes(backend)`` of it, all
    of it on NCCL and half on gloo. ``verdicts``: that claim, measured up to three times
    (``lab.verdict.verified``)."""

    identity: CollectiveIdentity
    backend: str
    verdicts: tuple[Verdict, ...]


def run_identity_check(ranks, numel: int, repeats: int = 5) -> IdentityCheck:
    """All-reduce against reduce-scatter + all-gather of ``numel`` float32 values: the values and bytes
    exactly, the times as one ``Verdict`` (predicted: the pair's time x 2 / its passes; band
    ``IDENTITY_BAND``)."""
    low, high = IDENTITY_BAND
    share = PASSES["all_reduce"] / pair_passes(ranks.backend)

    def claims(found: CollectiveIdentity):
        return [Verdict(f"all-reduce time, against {share:.2g} x (reduce-scatter + all-gather)", share * found.split_s,
                        found.median_s["all_reduce"], "s", low, high)]

    found, verdicts = verified(lambda: run_collective_identity(ranks, numel, repeats), claims)
    return IdentityCheck(found, ranks.backend, verdicts)


@dataclass(frozen=True)
class BucketOverlapCheck:
    """``run_overlap`` per strategy with its timing claim. On ranks whose "network" is the cores that
    compute (gloo on a CPU), the transfers hidden under the backward take their cycles from it, so the
    step with overlap is predicted to take as long as the step without (band ``BUCKET_OVERLAP_BAND``), although
    most of the communication's time is hidden (``hidden_share``). Perfect overlap, the step less its
    communication (``perfect_s``), is what GPUs approach, where the bytes travel on other hardware.
    ``comparisons``: strategy -> ``OverlapComparison``."""

    comparisons: dict[str, OverlapComparison]
    verdicts: tuple[Verdict, ...]

    def __getitem__(self, strategy: str) -> OverlapComparison:
        return self.comparisons[strategy]

    def items(self):
        return self.comparisons.items()


def run_bucket_overlap_check(ranks, model, batches, lr: float, strategies=("ddp", "zero3"), *,
                      bucket_bytes: float | None = None, repeats: int = 2) -> BucketOverlapCheck:
    """``run_overlap`` for each of ``strategies`` and one ``Verdict`` each: the step with overlap against
    the step without (predicted equal on CPU ranks)."""
    low, high = BUCKET_OVERLAP_BAND

    def measure():
        return {s: run_overlap(ranks, s, model, batches, lr, bucket_bytes=bucket_bytes, repeats=repeats)
                for s in strategies}

    def claims(found):
        return [Verdict(f"{STRATEGY_TITLES[s]} step with overlap, against the step without", o.step_s_without,
                        o.step_s_with, "s", low, high) for s, o in found.items()]

    found, verdicts = verified(measure, claims)
    return BucketOverlapCheck(found, verdicts)
