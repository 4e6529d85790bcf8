"""Data-parallel runs on a pool, gathered into frozen dataclasses and read against the formulas.

``run_data_parallel`` trains one strategy on every rank (``ranks.train_on_rank``) and returns a
``DataParallelRun``: the trained weights, what each rank kept, the comm log and the timeline, cut into
steps and set beside ``predict``. ``run_strategies``, ``run_overlap``, ``run_collective_identity`` and
``run_peer`` are what notebook 08 measures: every strategy side by side, overlap on and off, all-reduce
against reduce-scatter + all-gather, PyTorch's DDP and FSDP2. Timing claims keep the median of repeated
runs: a busy machine can stall any single run, and a stall only ever adds time. Their verdicts are in
``claims``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import choice, flag, whole_number
from shardlib.core.data_parallel.flat import STRATEGIES, FlatGroup
from shardlib.lab.data_parallel.peer import PEERS, torch_ddp_on_rank, torch_fsdp2_on_rank
from shardlib.lab.data_parallel.ranks import collectives_on_rank, train_on_rank
from shardlib.lab.data_parallel.reference import check_training_inputs, largest_gap, train_reference
from shardlib.lab.harness import on_ranks
from shardlib.predict.data_parallel import gathered_peak_bytes, layout_memory, layout_step_bytes
from shardlib.runtime.records import CommRecord, summarize
from shardlib.runtime.timeline import Span


@dataclass(frozen=True)
class DataParallelRun:
    """One training run on the ranks. ``state_dict``: rank 0's trained weights (``ranks_agree``: every
    rank ended with exactly these); ``memory_per_rank``: per rank, bytes of ``params``, ``grads`` and
    ``optimizer`` state kept between steps, and ``transient_peak``; ``losses``: the global loss of each
    step; ``comm`` and ``spans``: every rank's comm log and timeline."""

    strategy: str
    world_size: int
    state_dict: dict = field(repr=False)
    memory_per_rank: tuple[dict, ...]
    comm: tuple[CommRecord, ...] = field(repr=False)
    spans: tuple[Span, ...] = field(repr=False)
    losses: tuple[float, ...]
    groups: tuple[FlatGroup, ...] = field(repr=False)
    element_bytes: int
    ranks_agree: bool
    bucket_bytes: float | None
    overlap: bool
    prefetch: bool
    wall_s: float
    inputs: tuple = field(default=(), repr=False, compare=False)  # (model, batches, lr)

    @property
    def n_steps(self) -> int:
        return len(self.losses)

    @property
    def n_params(self) -> int:
        return sum(g.numel for g in self.groups)

    # -- steps ---------------------------------------------------------------------------------------
    def step_span(self, step: int, rank: int) -> Span:
        """Rank ``rank``'s span of step ``step`` (negative counts from the end)."""
        step = range(self.n_steps)[step]
        return next(s for s in self.spans if s.kind == "step" and s.rank == rank and s.attrs.get("step") == step)

    def step_records(self, step: int, rank: int | None = None) -> list[CommRecord]:
        """The calls issued during step ``step``, on one rank or on all (the final gather of ZeRO-3's
        weights, after the last step, belongs to no step)."""
        ranks = range(self.world_size) if rank is None else [rank]
        out = []
        for r in ranks:
            window = self.step_span(step, r)
            out += [c for c in self.comm if c.rank == r and window.start_s <= c.start_s <= window.end_s]
        return out

    def bytes_per_step(self, step: int = -1, rank: int = 0) -> dict[str, dict[str, float]]:
        """Per op, measured on ``rank`` in ``step``: ``count``, ``size_bytes``, ``wire_bytes`` and ``duration_s``."""
        return summarize(self.step_records(step, rank))

    def wire_bytes_per_step(self, step: int = -1, rank: int = 0) -> int:
        return int(sum(row["wire_bytes"] for row in self.bytes_per_step(step, rank).values()))

    def step_s(self, skip_first: bool = True) -> float:
        """The median step time (the slowest rank's, per step), leaving out the first step (warm-up)."""
        steps = range(1 if skip_first and self.n_steps > 1 else 0, self.n_steps)
        return statistics.median(max(self.step_span(k, r).duration_s for r in range(self.world_size)) for k in steps)

    def comm_s(self, skip_first: bool = True) -> float:
        """The median over steps (first left out) of the time the slowest rank spent in communication:
        every call's whole duration, exposed or hidden."""
        steps = range(1 if skip_first and self.n_steps > 1 else 0, self.n_steps)
        return statistics.median(max(sum(c.duration_s for c in self.step_records(k, r)) for r in range(self.world_size))
                                 for k in steps)

    def hidden_share(self, skip_first: bool = True) -> float:
        """The share of communication time hidden under compute, over the steps (first left out):
        ``1 - waited / duration`` summed over every call, where a blocking call waits for all of its
        duration and an asynchronous one only for what ``wait()`` blocked (``CommRecord.waited_s``)."""
        records = [c for k in range(1 if skip_first and self.n_steps > 1 else 0, self.n_steps)
                   for c in self.step_records(k)]
        total = sum(c.duration_s for c in records)
        exposed = sum(c.duration_s if c.waited_s is None else min(c.waited_s, c.duration_s) for c in records)
        return 0.0 if total == 0 else 1.0 - exposed / total

    def launched_during_backward(self, step: int = -1, rank: int = 0) -> int:
        """How many asynchronous calls ``rank`` issued in ``step`` before that step's backward pass ended."""
        window = self.step_span(step, rank)
        end = next(s.end_s for s in self.spans if s.rank == rank and s.name == "backward"
                   and window.start_s <= s.start_s <= window.end_s)
        return sum(1 for c in self.step_records(step, rank) if c.waited_s is not None and c.start_s < end)

    # -- predictions ---------------------------------------------------------------------------------
    def predicted_memory(self) -> dict[str, int]:
        """``predict.layout_memory`` for this run's flat groups; for ZeRO-3 also the transient peak."""
        out = layout_memory(self.groups, self.strategy, self.element_bytes)
        if self.strategy == "zero3":
            out["transient_peak"] = gathered_peak_bytes(self.groups, self.element_bytes, self.prefetch)
        return out

    def predicted_bytes_per_step(self) -> dict[str, dict[str, int]]:
        return layout_step_bytes(self.groups, self.strategy, self.element_bytes, self.world_size)

    def against_reference(self, reference: dict | None = None) -> float:
        """The largest difference from one process trained on the whole batches (within ``TOLERANCE``
        when the strategy is right). ``reference``: that process's ``state_dict``, if already trained
        (``train_reference(model, batches, lr).state_dict``)."""
        if reference is None:
            model, batches, lr = self.inputs
            reference = train_reference(model, batches, lr).state_dict
        return largest_gap(self.state_dict, reference)


def run_data_parallel(ranks, strategy: str, model: torch.nn.Module, batches, lr: float, *,
                      bucket_bytes: float | None = None, overlap: bool = True,
                      prefetch: bool = True) -> DataParallelRun:
    """Train ``model`` on ``batches`` with ``strategy`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"``)
    on every rank of ``ranks``: each rank takes its contiguous share of each global batch's rows; the
    loss is the mean squared error over the global batch; AdamW(lr) (``reference.AdamW``, torch's arithmetic).

    ``bucket_bytes``: DDP's and ZeRO-1/2's gradient bucket size (``None``: one bucket). ``overlap``:
    launch the gradient collectives during the backward (DDP, ZeRO-2, ZeRO-3's reduce-scatters), or all
    after it. ``prefetch``: ZeRO-3 gathers the next layer while the current one computes.
    """
    check_training_inputs(ranks.world_size, strategy, model, batches, lr, bucket_bytes)
    overlap, prefetch = flag(overlap, "overlap"), flag(prefetch, "prefetch")
    start = time.perf_counter()
    got = on_ranks(ranks, train_on_rank, strategy, model, batches, lr, bucket_bytes, overlap, prefetch)
    wall = time.perf_counter() - start
    first = got.first("state_dict")
    agree = all(sd.keys() == first.keys() and all(torch.equal(sd[k], first[k]) for k in first)
                for sd in got.each("state_dict"))
    element_bytes = next(iter(model.parameters())).element_size()
    return DataParallelRun(strategy, ranks.world_size, first, got.each("memory"), tuple(ranks.last_comm),
                           tuple(ranks.last_spans), got.across("local_losses", sum), got.first("groups"),
                           element_bytes, agree, bucket_bytes, overlap, prefetch, wall, (model, batches, lr))


@dataclass(frozen=True)
class StrategyRuns:
    """The same training once per strategy: ``runs[strategy]`` is its ``DataParallelRun``."""

    runs: dict[str, DataParallelRun]

    def __getitem__(self, strategy: str) -> DataParallelRun:
        return self.runs[strategy]

    def items(self):
        return self.runs.items()


def run_strategies(ranks, model, batches, lr: float, strategies=STRATEGIES, **options) -> StrategyRuns:
    """``run_data_parallel`` once per strategy, on the same model and batches."""
    return StrategyRuns({s: run_data_parallel(ranks, s, model, batches, lr, **options) for s in strategies})


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
    def perfect_s(self) -> float:
        """The step perfect overlap would give: the step without overlap less all of its communication."""
        return self.step_s_without - self.without_overlap.comm_s()

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
        on.append(run_data_parallel(ranks, strategy, model, batches, lr, bucket_bytes=bucket_bytes,
                                      overlap=True, prefetch=True))
        off.append(run_data_parallel(ranks, strategy, model, batches, lr, bucket_bytes=bucket_bytes,
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
    gap = max(float((r.all_reduce - r.reduce_scatter_all_gather).abs().max()) for r in out)
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
    theirs = ranks.run(fn, model, batches, lr)[0].state_dict
    ours = run_data_parallel(ranks, strategy, model, batches, lr).state_dict
    reference = train_reference(model, batches, lr).state_dict
    return PeerComparison(peer, strategy, largest_gap(theirs, ours), largest_gap(theirs, reference),
                          largest_gap(ours, reference))
