"""Communication costs measured on a pool through ``lab.harness.on_ranks``, each beside its prediction.

* ``run_calibration``: this machine's latency and bandwidth, fitted to a sweep of message sizes whose
  rounds take every point in turn, so a burst of other work spoils a round of many points, not all of one.
* ``run_decode_vs_prefill``: all-reduces of one token (decode) and of thousands (prefill) at tp = 2 and 4,
  fastest rounds (medians beside them) against the prediction of a link fitted to fastest rounds.
* ``run_slow_rank``: one rank delayed; how long every rank then spends inside each collective.
* ``run_replicas_vs_tp``: replicas against one tensor-parallel copy, a step of each in turn.

A pool larger than the group a measurement needs runs it on its first ranks (``ranks.leading_group``);
every argument is checked before any rank runs. Their verdicts are in ``claims``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from shardlib.core.checks import number_between, whole_number, whole_number_between
from shardlib.core.config import ModelConfig
from shardlib.core.toy import stack_weights
from shardlib.facts.hardware import LATENCY_CHARGES, Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.ranks import (
    MAX_DELAY_S,
    SLOW_RANK_OPS,
    serve_both_ways_on_rank,
    serving_model,
    slow_rank_on_rank,
    sweep_on_rank,
)
from shardlib.lab.harness import Measured, on_ranks
from shardlib.predict.alpha_beta import (
    DEFAULT_CALLS,
    DEFAULT_ROUNDS,
    DEFAULT_SIZES_BYTES,
    ROUND_STATISTICS,
    SWEEP_OPS,
    Calibration,
    Sample,
    all_reduce_s,
    check_sizes,
    collective_terms_s,
    collective_time_s,
    fit_link,
    slowest_samples,
)
from shardlib.predict.serving.replicas import ReplicasVsTensorParallel, replicas_vs_tensor_parallel

CALL_BUDGET_BYTES = 2 * 2 ** 20  # calls per round for a large message: as many as fit 2 MiB, at least 1


def _group_size(ranks, n_ranks: int | None, what: str) -> int:
    """The ranks a measurement runs on: all of ``ranks`` or its first ``n_ranks``."""
    n = ranks.world_size if n_ranks is None else whole_number(n_ranks, f"{what} (the ranks it runs on)")
    if n < 2:
        raise ValueError(f"{what} needs at least 2 ranks, got {n}")
    if n > ranks.world_size or ranks.world_size % n:
        raise ValueError(f"{what} = {n} needs a pool whose size is a multiple of {n}; this pool has "
                         f"{ranks.world_size} ranks")
    return n


def _sweep(ranks, points, rounds: int, degrees) -> dict[int, list]:
    """``{n: per rank, {(op, size_bytes): [seconds per call, one a round]}}`` on the first ``n`` ranks for
    each of ``degrees`` (``None`` for a rank outside the group or the ping-pong). ``points``: ``(op,
    size_bytes, calls)``. A round is one ``sweep_on_rank`` per degree, the points reversed every other
    round; the first round runs twice and keeps the second (buffers allocated). A rank's time runs from the
    last rank's start of a burst to its own end, over ``calls``."""
    out = {n: [{} for _ in range(ranks.world_size)] for n in degrees}
    for r in range(rounds):
        for n in degrees:
            got = on_ranks(ranks, sweep_on_rank, points[::1 - 2 * (r % 2)], n, repeats=2 if r == 0 else 1)
            for op, size, calls in points:
                bursts = [s for s in got.spans("burst") if (s.attrs["op"], s.attrs["size_bytes"]) == (op, size)]
                last_start = max(s.start_s for s in bursts)
                per_call = calls * (2 if op == "point_to_point" else 1)  # a ping-pong's one way: half a round trip
                for rank in range(n):  # None outside the ping-pong
                    out[n][rank].setdefault((op, size), [] if rank < len(bursts) else None)
                for s in bursts:
                    out[n][s.rank][(op, size)].append((s.end_s - last_start) / per_call)
    return {n: [times or None for times in per_rank] for n, per_rank in out.items()}


def run_calibration(ranks, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
                    latency_charge: str = "per_step", n_ranks: int | None = None, statistic: str = "fastest",
                    ops=SWEEP_OPS) -> Calibration:
    """Sweep ``ops`` over ``sizes_bytes`` on ``ranks`` (a ``Ranks`` pool; on its first ``n_ranks`` ranks if
    given), ``rounds`` rounds of ``calls`` calls, and fit this machine's latency and bandwidth to each
    point's ``statistic`` round: ``"fastest"`` (the floor: what the link costs when nothing else gets in
    the way) or ``"median"`` (the typical call)."""
    if ranks.world_size < 2:
        raise ValueError(f"a communication sweep needs at least 2 ranks, got a pool of {ranks.world_size}")
    if statistic not in ROUND_STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(ROUND_STATISTICS)}, got {statistic!r}")
    ops = tuple(ops)
    if not ops or any(op not in SWEEP_OPS for op in ops):
        raise ValueError(f"the sweep times some of {', '.join(SWEEP_OPS)}; got {ops!r}")
    n = _group_size(ranks, n_ranks, "n_ranks")
    whole_number(rounds, "rounds"), whole_number(calls, "calls")
    sizes = check_sizes(sizes_bytes, n)
    start = time.perf_counter()
    per_rank = _sweep(ranks, [(op, size, calls) for size in sizes for op in ops], rounds, (n,))[n]
    samples = slowest_samples(per_rank, n, statistic)
    per_op = {op: fit_link([s for s in samples if s.op == op], latency_charge) for op in ops}
    return Calibration(tuple(samples), fit_link(samples, latency_charge), per_op, time.perf_counter() - start,
                       latency_charge, ranks.backend)


# -- decode against prefill, measured ------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeVsPrefillRun:
    """All-reduces of ``model``'s activations per count of ``tokens`` (1: a decode step; thousands: a prefill)
    at each tp degree: each point's fastest round (``floors``, slowest rank) against ``link`` (a fit to
    fastest rounds: other work only ever adds time), its median round (``medians``) beside it."""

    model: ModelConfig
    link: Link
    latency_charge: str
    tokens: tuple[int, ...]
    tp_degrees: tuple[int, ...]
    floors: tuple[Sample, ...]
    medians: tuple[Sample, ...] = ()

    def size_bytes(self, tokens: int) -> int:
        return int(tokens * self.model.d_model * self.model.bytes_per_param)

    def measured_s(self, tp: int, tokens: int, typical: bool = False) -> float:
        """The point's fastest round (``typical``: its median round)."""
        size = self.size_bytes(tokens)
        return next(s.seconds for s in (self.medians if typical else self.floors)
                    if s.n_ranks == tp and s.size_bytes == size)

    def predicted_terms_s(self, tp: int, tokens: int) -> tuple[float, float]:  # (latency part, bandwidth part)
        return collective_terms_s("all_reduce", self.size_bytes(tokens), tp, self.link, self.latency_charge)

    def predicted_s(self, tp: int, tokens: int) -> float:
        return sum(self.predicted_terms_s(tp, tokens))

    def neighbours_s(self, tp: int, tokens: int) -> float:
        """The point's time as a fit of the *other* points of this run at ``tp`` predicts it (leave one
        out): a latency and a bandwidth measured in the same rounds, on the same ranks. Needs two other
        message sizes."""
        size = self.size_bytes(tokens)
        fit = fit_link([s for s in self.floors if s.n_ranks == tp and s.size_bytes != size], self.latency_charge)
        return collective_time_s("all_reduce", size, tp, fit.link(), self.latency_charge)

    def ratio(self, tp: int, tokens: int) -> float:  # measured over predicted
        return self.measured_s(tp, tokens) / self.predicted_s(tp, tokens)

    def bound(self, tp: int, tokens: int) -> str:  # "latency" or "bandwidth": the larger part of the prediction
        latency, bandwidth = self.predicted_terms_s(tp, tokens)
        return "latency" if latency >= bandwidth else "bandwidth"


def run_decode_vs_prefill(ranks, link: Link, model: ModelConfig = LLAMA_3_8B, tokens=(1, 16, 256, 2048),
                          tp_degrees=(2, 4), rounds: int = 7, calls: int = 8,
                          latency_charge: str = "per_step") -> DecodeVsPrefillRun:
    """Time one all-reduce of ``tokens x d_model`` activations of ``model`` (its own bytes per value) on
    the first ``tp`` ranks of ``ranks`` for each degree in ``tp_degrees``: ``rounds`` rounds of ``calls``
    calls back to back (fewer for large messages: as many as fit ``CALL_BUDGET_BYTES``), every size and
    degree in turn within each round (``_sweep``)."""
    if latency_charge not in LATENCY_CHARGES:
        raise ValueError(f"latency_charge must be one of {', '.join(LATENCY_CHARGES)}, got {latency_charge!r}")
    tokens = tuple(whole_number(t, "tokens (per message)") for t in tokens)
    degrees = tuple(_group_size(ranks, tp, "tp") for tp in tp_degrees)
    if not tokens or not degrees:
        raise ValueError("give at least one token count and one tp degree")
    whole_number(rounds, "rounds"), whole_number(calls, "calls")
    sizes = [int(t * model.d_model * model.bytes_per_param) for t in tokens]
    for tp in degrees:
        check_sizes(sizes, tp)
    points = [("all_reduce", size, max(1, min(calls, CALL_BUDGET_BYTES // size))) for size in sizes]
    per_degree = _sweep(ranks, points, rounds, degrees)
    floors = [s for tp, per_rank in per_degree.items() for s in slowest_samples(per_rank, tp)]
    medians = [s for tp, per_rank in per_degree.items() for s in slowest_samples(per_rank, tp, "median")]
    return DecodeVsPrefillRun(model, link, latency_charge, tokens, degrees, tuple(floors), tuple(medians))


# -- one slow rank ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SlowRankRun:
    """Rank ``slow_rank`` slept ``delay_s`` before each collective of ``ranks.SLOW_RANK_OPS``; ``got[op]``:
    that collective measured on every rank, from leaving the harness's barrier."""

    slow_rank: int
    delay_s: float
    got: dict[str, Measured]

    @property
    def ops(self) -> list[str]:
        return list(self.got)

    def steps_s(self, op: str) -> tuple[float, ...]:  # per rank: from leaving the barrier to the end of op
        got = self.got[op]
        return tuple(got.elapsed_s(rank)[-1] for rank in range(len(got.times_s)))

    def collective_s(self, op: str) -> tuple[float, ...]:  # per rank: inside op itself
        return tuple(r.duration_s for r in self.got[op].records(SLOW_RANK_OPS[op]))

    def step_s(self, op: str) -> float:  # the step of op: it ends for everybody when the slowest rank is done
        return max(self.steps_s(op))

    def inside_s(self, rank: int) -> float:  # seconds rank spent inside collectives, over every op
        return sum(self.collective_s(op)[rank] for op in self.ops)

    @property
    def spans(self) -> tuple:  # every collective's timeline, the slow rank's "throttled" sleeps among them
        return tuple(span for got in self.got.values() for span in got.timeline)


def run_slow_rank(ranks, slow_rank: int, delay_s: float) -> SlowRankRun:
    """Rank ``slow_rank`` sleeps ``delay_s`` before each collective of ``SLOW_RANK_OPS``, one at a time."""
    whole_number_between(slow_rank, "slow_rank", 0, ranks.world_size - 1)
    number_between(delay_s, "delay_s (seconds)", 0.0, MAX_DELAY_S)
    return SlowRankRun(slow_rank, delay_s, {op: on_ranks(ranks, slow_rank_on_rank, op, slow_rank, delay_s)
                                            for op in SLOW_RANK_OPS})


# -- replicas against one tensor-parallel copy -----------------------------------------------------------------
@dataclass(frozen=True)
class ReplicasVsTPRun:
    """Both ways of serving on the ``tp`` ranks that answered in ``got`` (``serve_both_ways_on_rank``, repeat 0
    a warm-up): ``measured`` (each way's median step, ending with the group's slowest rank) and
    ``predicted`` from the replicas' step and ``link``, each a ``predict.ReplicasVsTensorParallel``."""

    got: Measured
    model: ModelConfig
    link: Link
    batch: int
    latency_charge: str = "per_step"

    @property
    def tp(self) -> int:
        return len(self.got.ranks)

    @property
    def _timed(self) -> range:  # the repeats after the warm-up
        return range(1, len(self.got.times_s[0]))

    def _spans(self, name: str) -> list[tuple]:  # per timed repeat, the group's spans called name
        return [self.got.spans(name, repeat=i) for i in self._timed]

    @property
    def replica_steps_s(self) -> tuple[float, ...]:  # every step, the slowest replica
        return tuple(max(s.duration_s for s in spans) for spans in self._spans("replica"))

    @property
    def tp_steps_s(self) -> tuple[float, ...]:  # from the last rank's start (an earlier one waits) to the last end
        return tuple(max(s.end_s for s in spans) - max(s.start_s for s in spans) for spans in self._spans("tp"))

    @property
    def tp_all_reduce_s_per_step(self) -> float:
        """Measured: the median step's time inside the all-reduces (moving bytes, and waiting), slowest rank."""
        return statistics.median(max(sum(r.duration_s for r in self.got.records("all_reduce", rank, i))
                                     for rank in self.got.ranks) for i in self._timed)

    @property
    def predicted_comm_s_per_step(self) -> float:  # one all-reduce of batch x d_model float32 per layer
        size = self.batch * self.model.d_model * 4
        return self.model.n_layers * all_reduce_s(size, self.tp, self.link, self.latency_charge)

    @property
    def max_output_gap(self) -> float:  # the tensor-parallel outputs against rank 0's replica: the same requests
        return self.got.max_gap("tp", self.got.first("replica"))

    @property
    def measured(self) -> ReplicasVsTensorParallel:
        return ReplicasVsTensorParallel(self.tp, self.batch, statistics.median(self.replica_steps_s),
                                        statistics.median(self.tp_steps_s))

    @property
    def predicted(self) -> ReplicasVsTensorParallel:  # a tp step: the replicas' measured step over tp, plus comm
        return replicas_vs_tensor_parallel(self.measured.replica_step_s, self.predicted_comm_s_per_step, self.tp,
                                           self.batch)


def run_replicas_vs_tp(ranks, link: Link, model: ModelConfig | None = None, batch: int = 8, steps: int = 12,
                       seed: int = 0, latency_charge: str = "per_step", tp: int | None = None) -> ReplicasVsTPRun:
    """Serve ``steps`` steps (after one untimed) both ways on the first ``tp`` ranks of ``ranks`` (all of
    them by default), a step of each in turn (``serve_both_ways_on_rank``), so both see the same load."""
    model = serving_model() if model is None else model
    n = _group_size(ranks, tp, "tp")
    if model.d_ff % n:
        raise ValueError(f"d_ff = {model.d_ff} cannot be split {n} ways")
    whole_number(batch, "batch"), whole_number(steps, "steps")
    layers = stack_weights(model, seed, ("mlp",))
    got = on_ranks(ranks, serve_both_ways_on_rank, layers, model, seed, batch, n, repeats=steps + 1)
    return ReplicasVsTPRun(got, model, link, batch, latency_charge)
