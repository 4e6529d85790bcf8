"""The measurements notebook 06 sets beside the formulas: every strategy side by side, overlap against no
overlap, all-reduce against reduce-scatter + all-gather, and PyTorch's own DDP and FSDP2 as peers.

Timing claims are medians: a run is repeated and the run with the median step time kept, because
another process on a shared machine can stall any single run (a stall only ever adds time).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ..checks import choice, whole_number
from .drivers import DataParallelRun, train_data_parallel
from .flat import STRATEGIES
from .peer import PEERS, torch_ddp_on_rank, torch_fsdp2_on_rank
from .ranks import collectives_on_rank
from .reference import check_training_inputs, largest_gap, train_reference


def run_strategies(ranks, model, batches, lr: float, strategies=STRATEGIES, **options) -> dict[str, DataParallelRun]:
    """``train_data_parallel`` once per strategy, on the same model and batches."""
    return {s: train_data_parallel(ranks, s, model, batches, lr, **options) for s in strategies}


def _median_run(runs: list[DataParallelRun]) -> DataParallelRun:
    return sorted(runs, key=lambda r: r.step_s())[(len(runs) - 1) // 2]


@dataclass(frozen=True)
class OverlapComparison:
    """The same training with its collectives overlapped with compute (DDP's and ZeRO-2's buckets
    launched during the backward; ZeRO-3's prefetch and asynchronous reduce-scatters) and without."""

    strategy: str
    with_overlap: DataParallelRun
    without_overlap: DataParallelRun

    @property
    def step_s_with(self) -> float:
        return self.with_overlap.step_s()

    @property
    def step_s_without(self) -> float:
        return self.without_overlap.step_s()

    @property
    def hidden_share(self) -> float:
        """The share of communication time hidden under compute, with overlap."""
        return self.with_overlap.hidden_share()

    @property
    def saved_share(self) -> float:
        """How much shorter the step is with overlap, as a share of the step without."""
        return 1.0 - self.step_s_with / self.step_s_without


def run_overlap(ranks, strategy: str, model, batches, lr: float, *, bucket_bytes: float | None = None,
                repeats: int = 3) -> OverlapComparison:
    """Train with and without overlap, ``repeats`` times each (alternating), and keep each side's median
    run by step time."""
    repeats = whole_number(repeats, "repeats")
    check_training_inputs(ranks.world_size, strategy, model, batches, lr, bucket_bytes)
    on, off = [], []
    for _ in range(repeats):
        on.append(train_data_parallel(ranks, strategy, model, batches, lr, bucket_bytes=bucket_bytes,
                                      overlap=True, prefetch=True))
        off.append(train_data_parallel(ranks, strategy, model, batches, lr, bucket_bytes=bucket_bytes,
                                       overlap=False, prefetch=False))
    return OverlapComparison(strategy, _median_run(on), _median_run(off))


@dataclass(frozen=True)
class CollectiveIdentity:
    """An all-reduce against a reduce-scatter followed by an all-gather of the same buffer, on the ranks:
    the largest difference of the results, and per op the wire bytes per rank and the median time."""

    world_size: int
    size_bytes: int
    max_gap: float
    wire_bytes: dict
    median_s: dict

    @property
    def split_wire_bytes(self) -> int:
        return self.wire_bytes["reduce_scatter"] + self.wire_bytes["all_gather"]

    @property
    def split_s(self) -> float:
        return self.median_s["reduce_scatter"] + self.median_s["all_gather"]


def run_collective_identity(ranks, numel: int, repeats: int = 5) -> CollectiveIdentity:
    """All-reduce ``numel`` float32 values, and reduce-scatter then all-gather them, ``repeats`` times."""
    numel, repeats = whole_number(numel, "numel"), whole_number(repeats, "repeats")
    if numel % ranks.world_size:
        raise ValueError(f"numel = {numel} must divide among {ranks.world_size} ranks for a reduce-scatter")
    out = ranks.run(collectives_on_rank, numel, repeats)
    gap = max(float((r["all_reduce"] - r["reduce_scatter_all_gather"]).abs().max()) for r in out)
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    rank0 = [c for c in ranks.last_comm if c.rank == 0]
    wire = {op: next(c.wire_bytes for c in rank0 if c.op == op) for op in ops}
    times = {op: _median_time(ranks.last_comm, op) for op in ops}
    return CollectiveIdentity(ranks.world_size, numel * 4, gap, wire, times)


def _median_time(records, op: str) -> float:
    """The median over rounds of the slowest rank's time for ``op``."""
    per_rank: dict[int, list[float]] = {}
    for c in records:
        if c.op == op:
            per_rank.setdefault(c.rank, []).append(c.duration_s)
    rounds = zip(*per_rank.values())
    return statistics.median(max(r) for r in rounds)


@dataclass(frozen=True)
class PeerComparison:
    """PyTorch's own implementation against this package's strategy, both trained on the same ranks: the
    largest differences between the two, and of each from one process."""

    peer: str
    strategy: str
    peer_to_ours: float
    peer_to_reference: float
    ours_to_reference: float


PEER_OF = {"torch_ddp": "ddp", "torch_fsdp2": "zero3"}


def run_peer(ranks, peer: str, model, batches, lr: float) -> PeerComparison:
    """Train with ``peer`` (``"torch_ddp"`` or ``"torch_fsdp2"``) and with the matching strategy of this
    package (``ddp`` or ``zero3``), and compare the trained weights."""
    choice(peer, PEERS, "peer")
    strategy = PEER_OF[peer]
    check_training_inputs(ranks.world_size, strategy, model, batches, lr)
    fn = torch_ddp_on_rank if peer == "torch_ddp" else torch_fsdp2_on_rank
    theirs = ranks.run(fn, model, batches, lr)[0]["state_dict"]
    ours = train_data_parallel(ranks, strategy, model, batches, lr).state_dict
    reference = train_reference(model, batches, lr).state_dict
    return PeerComparison(peer, strategy, largest_gap(theirs, ours), largest_gap(theirs, reference),
                          largest_gap(ours, reference))

