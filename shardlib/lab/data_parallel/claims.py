"""Notebook 08's timed comparisons on a pool and their claims (``lab.verdict``).

``run_collective_identity``: all-reduce against reduce-scatter + all-gather of one buffer (values, bytes,
median times); ``identity_verdicts`` its timing claim. ``run_overlap``: the same training with its
collectives overlapped with compute and without; ``overlap_verdicts`` its claim. Measure until the claim
holds with ``lab.verdict.verified(lambda: run_x(...), x_verdicts)``. Timing claims keep the median of
repeated runs: a stall on a busy machine only ever adds time.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import whole_number
from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.lab.data_parallel.drivers import DataParallelRun, run_data_parallel
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict

IDENTITY_BAND = (0.5, 2.0)  # all-reduce time / its prediction from the pair's time and passes
BUCKET_OVERLAP_BAND = (0.5, 2.0)  # step with overlap / step without, on ranks that share their cores with the transfers
OPS = ("all_reduce", "reduce_scatter", "all_gather")


def pair_passes(backend: str) -> int:
    """Ring passes of (n-1)/n over the buffer a reduce-scatter and an all-gather make together: 2 on NCCL
    (the all-reduce's two halves), 4 on gloo (which builds each on an all-reduce of the whole buffer)."""
    return 4 if backend == "gloo" else 2


def summed_on_rank(ctx, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``numel`` float32 values, different on every rank, summed by an all-reduce, then by a reduce-scatter
    and an all-gather: back to back, so that both ways meet the machine in the same state."""
    g = torch.Generator().manual_seed(1000 + ctx.rank)
    buffer = torch.randn(numel, generator=g).to(ctx.device)  # (numel,), numel divisible by world_size
    whole = ctx.comm.all_reduce(buffer.clone())  # (numel,), in place on its copy
    return whole, ctx.comm.all_gather(ctx.comm.reduce_scatter(buffer))  # (numel / world_size,), then (numel,)


@dataclass(frozen=True)
class CollectiveIdentity:
    """An all-reduce (2 ring passes) against a reduce-scatter then an all-gather of the same buffer
    (``pair_passes``), both in every repeat (``summed_on_rank``): the largest difference of the results, per
    op rank 0's wire bytes and the median time."""

    got: Measured = field(repr=False)
    backend: str = "gloo"

    @property
    def max_gap(self) -> float:
        return max(float((whole - split).abs().max()) for whole, split in self.got.each())

    @property
    def wire_bytes(self) -> dict[str, int]:
        return {op: self.got.bytes(op, rank=0, wire=True) for op in OPS}

    @property
    def median_s(self) -> dict[str, float]:
        """Per op, the median over repeats of the slowest rank's time."""
        return {op: statistics.median(max(c.duration_s for c in self.got.records(op, repeat=i))
                                      for i in range(len(self.got.times_s[0]))) for op in OPS}

    split_wire_bytes = property(lambda self: self.wire_bytes["reduce_scatter"] + self.wire_bytes["all_gather"])
    split_s = property(lambda self: self.median_s["reduce_scatter"] + self.median_s["all_gather"])


def run_collective_identity(ranks, numel: int, repeats: int = 5) -> CollectiveIdentity:
    """Sum ``numel`` float32 values ``repeats`` times, each after a barrier, both ways in each repeat: an
    all-reduce, then a reduce-scatter and an all-gather. Run one way after the other and a machine that
    changes pace between the two (seen here: a 1 MiB all-reduce at 1 ms in one batch, 4 ms in the next)
    would set a fast all-reduce beside a slow pair."""
    numel, repeats = whole_number(numel, "numel"), whole_number(repeats, "repeats")
    if numel % ranks.world_size:
        raise ValueError(f"numel = {numel} must divide among {ranks.world_size} ranks for a reduce-scatter")
    return CollectiveIdentity(on_ranks(ranks, summed_on_rank, numel, repeats=repeats), ranks.backend)


def identity_verdicts(found: CollectiveIdentity) -> list[Verdict]:
    """The timing claim: the all-reduce takes the pair's time x 2 / its passes (band ``IDENTITY_BAND``)."""
    share = 2 / pair_passes(found.backend)
    return [Verdict(f"all-reduce time, against {share:.2g} x (reduce-scatter + all-gather)", share * found.split_s,
                    found.median_s["all_reduce"], "s", *IDENTITY_BAND)]


@dataclass(frozen=True)
class OverlapComparison:
    """The same training with its collectives overlapped with compute and without."""

    with_overlap: DataParallelRun
    without_overlap: DataParallelRun

    @property
    def perfect_s(self) -> float:
        """The step perfect overlap would give: the step without overlap less all of its communication."""
        return self.without_overlap.step_s() - self.without_overlap.comm_s()


def median_run(runs: list[DataParallelRun]) -> DataParallelRun:
    """The run of median step time (the lower middle one of an even count)."""
    return sorted(runs, key=lambda r: r.step_s())[(len(runs) - 1) // 2]


def run_overlap(ranks, strategy: str, model, batches, lr: float, *, bucket_bytes: float | None = None,
                repeats: int = 3) -> OverlapComparison:
    """Train with and without overlap, ``repeats`` times each (alternating), and keep each side's median
    run by step time."""
    repeats = whole_number(repeats, "repeats")
    runs = {True: [], False: []}
    for _ in range(repeats):
        for on in (True, False):
            runs[on].append(run_data_parallel(ranks, strategy, model, batches, lr, bucket_bytes=bucket_bytes,
                                              overlap=on, prefetch=on))
    return OverlapComparison(median_run(runs[True]), median_run(runs[False]))


def overlap_verdicts(found: OverlapComparison) -> list[Verdict]:
    """The timing claim: where the "network" is the cores that compute (gloo on a CPU), hidden transfers take
    their cycles from the backward, so the steps with and without overlap are predicted equal, although most
    of the communication is hidden (``DataParallelRun.hidden_share``). GPUs, whose bytes travel on other
    hardware, approach ``perfect_s``."""
    return [Verdict(f"{STRATEGY_TITLES[found.with_overlap.strategy]} step with overlap, against the step without",
                    found.without_overlap.step_s(), found.with_overlap.step_s(), "s", *BUCKET_OVERLAP_BAND)]
