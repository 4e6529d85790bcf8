"""Context parallelism run on a pool, against the unsharded attention, the work count and the cost model.

``run_ring_attention``, ``run_ulysses_attention`` and ``run_all_gather_attention`` (forward only) each
return an ``AttentionRun``: the output's gap, the ring's compute, step time and transfers, or the
collectives against ``predict``. ``run_ring_balance`` sets the two placements side by side,
``run_ring_overlap`` the ring with and without overlap against alpha-beta on the link
``run_exchange_calibration`` fits. Inputs are checked here, before any rank starts.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from shardlib.core.checks import TOLERANCE, flag, number_at_least, whole_number
from shardlib.core.context_parallel.all_gather import check_all_gather_inputs
from shardlib.core.context_parallel.online_softmax import attention_reference
from shardlib.core.context_parallel.placement import PLACEMENTS, RankWork, blocks_between, causal_work, imbalance
from shardlib.core.context_parallel.ring import check_ring_inputs
from shardlib.core.context_parallel.ulysses import check_ulysses_inputs
from shardlib.facts.hardware import Link
from shardlib.lab.context_parallel.ranks import (
    all_gather_attention_on_rank,
    exchange_on_rank,
    ring_attention_on_rank,
    ulysses_attention_on_rank,
)
from shardlib.lab.context_parallel.reference import gather_sequence
from shardlib.lab.harness import Measured, on_ranks
from shardlib.predict.calibration import fastest_of_slowest, fit_link
from shardlib.predict.context_parallel import (
    AttentionShape,
    all_gather_kv_collectives,
    hidden_share,
    ring_time_s,
    ring_transfer_s,
    ulysses_collectives,
)


def _gap(out: torch.Tensor, q, k, v, causal: bool, scale) -> float:
    return float((out - attention_reference(q, k, v, causal, scale)).abs().max())


def attention_shape(q: torch.Tensor, k: torch.Tensor) -> AttentionShape:
    b, heads, seq, hd = q.shape
    return AttentionShape(b, heads, k.shape[1], seq, hd, q.element_size())


@dataclass(frozen=True)
class AttentionRun:
    """An attention method on a pool, ``repeats`` times, its ``gap`` from the whole-sequence attention, and
    its prediction: the ring's work (``placement.causal_work``) or the collectives, ``(op, size_bytes,
    wire_bytes)`` each, against rank 0's ``measured``. Times are medians over the repeats (per rank, or of
    the slowest rank); ``compute_cpu_s`` is CPU time, which a busy machine does not inflate. Blocks, bytes
    and spans are the last repeat's."""

    got: Measured = field(repr=False)
    placement: str
    causal: bool
    gap: float
    predicted_work: tuple[RankWork, ...] = ()
    predicted: tuple[tuple, ...] = ()

    world_size = property(lambda self: len(self.got.times_s))
    exact = property(lambda self: self.gap <= TOLERANCE)
    output = property(lambda self: gather_sequence(self.got.each(), self.placement))  # (b, H, s, hd)
    spans = property(lambda self: self.got.spans())
    compute_s = property(lambda self: self._compute(lambda s: s.duration_s))
    compute_cpu_s = property(lambda self: self._compute(lambda s: s.attrs["cpu_s"]))

    def _steps(self, rank: int, repeat: int = -1) -> list:
        """The rank's ring steps in ``repeat``, in order, each a compute span from ``ranks.RingProbe``."""
        return [s for s in self.got.spans(None, rank, repeat) if s.kind == "compute"]

    def _compute(self, seconds) -> tuple[float, ...]:
        return tuple(statistics.median(sum(map(seconds, self._steps(r, i))) for i in range(len(times)))
                     for r, times in enumerate(self.got.times_s))

    def _slowest(self, figure) -> float:
        """The median over the repeats of the slowest rank's ``figure(rank, repeat)``."""
        return statistics.median(max(figure(r, i) for r in range(self.world_size))
                                 for i in range(len(self.got.times_s[0])))

    @property
    def step_compute_s(self) -> tuple[float, ...]:
        return tuple(self._slowest(lambda r, i: self._steps(r, i)[step].duration_s) for step in range(self.world_size))

    @property
    def step_s(self) -> float:
        return self._slowest(lambda r, i: self.got.spans("forward", r, i)[0].duration_s)

    @property
    def waited_s(self) -> float:
        return self._slowest(lambda r, i: sum(c.waited_s or 0.0 for c in self.got.records(None, r, i)))

    @property
    def transfer_s(self) -> float:  # per moving step the longer of the send and the receive, summed
        return self._slowest(lambda r, i: sum(max(s.duration_s, v.duration_s) for s, v in
                                              zip(self.got.records("send", r, i), self.got.records("recv", r, i))))

    @property
    def computed_blocks(self) -> tuple[int, ...]:
        """Blocks each rank computed against the K/V its steps met (the prediction is ``predicted_work``)."""
        return tuple(sum(sum(blocks_between(r, s.attrs["source"], self.world_size, self.placement, self.causal))
                         for s in self._steps(r)) for r in range(self.world_size))

    @property
    def sent_bytes_per_rank(self) -> tuple[int, ...]:
        return tuple(self.got.bytes(None, r, wire=True) for r in range(self.world_size))

    @property
    def measured(self) -> tuple[tuple, ...]:
        return tuple((c.op, c.size_bytes, c.wire_bytes) for c in self.got.records(rank=0))

    @property
    def compute_imbalance(self) -> float:
        """The busiest rank's compute (CPU time) over the mean (1: even)."""
        return max(self.compute_cpu_s) * self.world_size / sum(self.compute_cpu_s)


def run_ring_attention(ranks, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                       placement: str = "contiguous", overlap: bool = True, scale: float | None = None,
                       repeats: int = 1, pad_compute_s: float | None = None) -> AttentionRun:
    """``ring.ring_attention`` on every rank, each on its shard of the whole ``q (b, H, s, hd)``, ``k, v
    (b, KV, s, hd)`` in ``placement``, ``repeats`` times, each step's compute padded to ``pad_compute_s``."""
    check_ring_inputs(q.shape, k.shape, v.shape, ranks.world_size, placement, local=False)
    flag(causal, "causal")
    flag(overlap, "overlap")
    if pad_compute_s is not None:
        number_at_least(pad_compute_s, "pad_compute_s")
    got = on_ranks(ranks, ring_attention_on_rank, q, k, v, causal, placement, overlap, scale, pad_compute_s,
                   repeats=whole_number(repeats, "repeats"))
    gap = _gap(gather_sequence(got.each(), placement), q, k, v, causal, scale)
    return AttentionRun(got, placement, causal, gap, tuple(causal_work(q.shape[2], ranks.world_size, placement,
                                                                       causal)))


@dataclass(frozen=True)
class Balance:
    """The same causal ring in each placement, ``runs[placement]``: per-rank CPU time against the blocks."""

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


def _exchange_s(got: Measured, rank: int, repeat: int) -> float:
    """From the rank's send's start to the later of its send's and its receive's completion."""
    calls = got.records(None, rank, repeat)
    return max(c.start_s + c.duration_s for c in calls) - min(c.start_s for c in calls)


def run_exchange_calibration(ranks, block_bytes: float, rounds: int = 5) -> ExchangeCalibration:
    """``predict.fit_link`` to ring exchanges (``ranks.exchange_on_rank``) from 1/256 of ``block_bytes`` to
    all of it, the fastest of ``rounds`` each after a warm-up; a sweep too noisy to fit, once more with
    twice the rounds."""
    sizes = tuple(sorted({max(64, int(block_bytes / f) // 64 * 64) for f in (256, 64, 16, 4, 1)}))
    n = ranks.world_size
    for attempt in (1, 2):
        used = whole_number(rounds, "rounds") * attempt
        per_rank = [{} for _ in range(n)]  # {("point_to_point", size): [seconds per round]}
        for size in sizes:
            got = on_ranks(ranks, exchange_on_rank, size, repeats=used + 1)  # the first, a warm-up
            for rank in range(n):
                per_rank[rank]["point_to_point", size] = [_exchange_s(got, rank, i) for i in range(1, used + 1)]
        try:
            fit = fit_link(fastest_of_slowest(per_rank, n))
            break
        except ValueError:
            if attempt == 2:
                raise
    return ExchangeCalibration(fit.link(f"this machine, ring exchange ({ranks.backend}, {n} ranks)"), sizes, used)


def run_ring_overlap(ranks, q, k, v, causal: bool = True, placement: str = "contiguous", repeats: int = 5,
                     link: Link | None = None, scale: float | None = None,
                     pad_compute_s: float | None = None) -> Overlap:
    """The ring with overlap and without, ``repeats`` passes each, against the prediction on ``link``
    (default: this machine's, fitted now by ``run_exchange_calibration``)."""
    check_ring_inputs(q.shape, k.shape, v.shape, ranks.world_size, placement, local=False)
    shape = attention_shape(q, k)
    if link is None:
        link = run_exchange_calibration(ranks, shape.kv_block_bytes(ranks.world_size)).link
    runs = {ov: run_ring_attention(ranks, q, k, v, causal, placement, ov, scale, repeats, pad_compute_s)
            for ov in (False, True)}
    return Overlap(runs[True], runs[False], link, ring_transfer_s(shape, ranks.world_size, link))


def _heads_run(ranks, fn, collectives, q, k, v, causal: bool, scale) -> AttentionRun:
    got = on_ranks(ranks, fn, q, k, v, flag(causal, "causal"), scale)
    predicted = tuple((op, int(size), int(round(wire))) for op, size, wire in
                      collectives(attention_shape(q, k), ranks.world_size))
    return AttentionRun(got, "contiguous", causal, _gap(got.cat(dim=2), q, k, v, causal, scale), predicted=predicted)


def run_ulysses_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None) -> AttentionRun:
    """``ulysses.ulysses_attention`` on every rank, against ``predict.ulysses_collectives``."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ranks.world_size, local=False)
    return _heads_run(ranks, ulysses_attention_on_rank, ulysses_collectives, q, k, v, causal, scale)


def run_all_gather_attention(ranks, q, k, v, causal: bool = True, scale: float | None = None) -> AttentionRun:
    """``all_gather.all_gather_kv_attention`` on every rank, against ``predict.all_gather_kv_collectives``."""
    check_all_gather_inputs(q.shape, k.shape, v.shape, ranks.world_size, local=False)
    return _heads_run(ranks, all_gather_attention_on_rank, all_gather_kv_collectives, q, k, v, causal, scale)
