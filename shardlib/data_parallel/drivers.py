"""Data-parallel training run on a pool, gathered, and read against the formulas and one process.

``train_data_parallel(ranks, strategy, model, batches, lr)`` checks its inputs here (a ValueError naming
the value before any rank starts), trains on every rank with ``train_on_rank`` and returns a
``DataParallelRun``: the trained weights, what each rank kept in memory, the comm log and the timeline,
with methods that cut the log into steps, count bytes per step, measure how much communication was
hidden under compute, and set all of it beside the predictions of ``predict``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..checks import flag
from ..runtime.measure import TOLERANCE
from ..runtime.records import CommRecord, summarize
from ..runtime.timeline import Span
from .flat import FlatGroup
from .predict import gathered_peak_bytes, layout_memory, layout_step_bytes
from .ranks import train_on_rank
from .reference import check_training_inputs, largest_gap, train_reference


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


def train_data_parallel(ranks, strategy: str, model: torch.nn.Module, batches, lr: float, *,
                        bucket_bytes: float | None = None, overlap: bool = True, prefetch: bool = True) -> DataParallelRun:
    """Train ``model`` on ``batches`` with ``strategy`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"``)
    on every rank of ``ranks``: each rank takes its contiguous share of each global batch's rows; the
    loss is the mean squared error over the global batch; ``torch.optim.AdamW(lr)``.

    ``bucket_bytes``: DDP's and ZeRO-1/2's gradient bucket size (``None``: one bucket). ``overlap``:
    launch the gradient collectives during the backward (DDP, ZeRO-2, ZeRO-3's reduce-scatters), or all
    after it. ``prefetch``: ZeRO-3 gathers the next layer while the current one computes.
    """
    check_training_inputs(ranks.world_size, strategy, model, batches, lr, bucket_bytes)
    overlap, prefetch = flag(overlap, "overlap"), flag(prefetch, "prefetch")
    start = time.perf_counter()
    per_rank = ranks.run(train_on_rank, strategy, model, batches, lr, bucket_bytes, overlap, prefetch)
    wall = time.perf_counter() - start
    first = per_rank[0]["state_dict"]
    agree = all(r["state_dict"].keys() == first.keys() and all(torch.equal(r["state_dict"][k], first[k]) for k in first)
                for r in per_rank)
    losses = tuple(sum(r["local_losses"][k] for r in per_rank) for k in range(len(batches)))
    element_bytes = next(iter(model.parameters())).element_size()
    return DataParallelRun(strategy, ranks.world_size, first, tuple(r["memory"] for r in per_rank),
                           tuple(ranks.last_comm), tuple(ranks.last_spans), losses, tuple(per_rank[0]["groups"]),
                           element_bytes, agree, bucket_bytes, overlap, prefetch, wall, (model, batches, lr))


def within_tolerance(run: DataParallelRun) -> bool:
    """Whether ``run`` trained to one process's weights within ``reference.TOLERANCE``."""
    return run.against_reference() <= TOLERANCE
