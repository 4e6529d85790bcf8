"""Communication costs measured on a pool, each beside its prediction.

* ``run_calibration``: this machine's latency and bandwidth, fitted to a sweep of message sizes whose rounds
  ``_spread_sweep`` spreads over time, every size in turn, so a burst of other work spoils no point alone.
* ``run_decode_vs_prefill``: all-reduces of one token (decode) and of thousands (prefill) at tp = 2 and 4,
  fastest rounds (medians beside them) against the prediction of a link fitted to fastest rounds.
* ``run_slow_rank``: one rank delayed; how long every rank then spends inside each collective.
* ``run_replicas_vs_tp``: replicas against one tensor-parallel copy, step by step in turn.

A pool larger than the group a measurement needs runs it on its first ranks (``ranks.leading_group``).
Their verdicts are in ``claims``.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import LATENCY_CHARGES, Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.ranks import SlowRankTimes, serve_both_ways_on_rank, slow_rank_on_rank, sweep_on_rank
from shardlib.lab.harness import on_ranks
from shardlib.predict.alpha_beta import all_reduce_s, collective_terms_s, collective_time_s
from shardlib.predict.calibration import (
    DEFAULT_CALLS,
    DEFAULT_ROUNDS,
    DEFAULT_SIZES_BYTES,
    SWEEP_OPS,
    Calibration,
    Sample,
    check_sizes,
    fastest_of_slowest,
    fit_link,
    median_of_slowest,
)
from shardlib.predict.costs import ReplicasVsTensorParallel, replicas_vs_tensor_parallel

STATISTICS = {"fastest": fastest_of_slowest, "median": median_of_slowest}


def _group_size(ranks, n_ranks: int | None, what: str) -> int:
    """The ranks a measurement runs on: all of ``ranks`` or its first ``n_ranks``, checked before any call."""
    n = ranks.world_size if n_ranks is None else whole_number(n_ranks, f"{what} (the ranks it runs on)")
    if n < 2:
        raise ValueError(f"{what} needs at least 2 ranks, got {n}")
    if n > ranks.world_size or ranks.world_size % n:
        raise ValueError(f"{what} = {n} needs a pool whose size is a multiple of {n}; this pool has "
                         f"{ranks.world_size} ranks")
    return n


def _merge(into: list, per_rank: list) -> None:
    """``per_rank`` (one sweep's result per rank) added round by round to ``into`` (empty dicts at first)."""
    for mine, new in zip(into, per_rank):
        mine.update({key: mine.get(key, []) + (times or []) for key, times in (new or {}).items()})


def _rank_results(merged: list) -> list:
    """Merged rounds as ``sweep_on_rank`` returns them: ``None`` for a rank outside the group or a point."""
    return [{k: v or None for k, v in m.items()} or None for m in merged]


def _spread_sweep(ranks, batches, rounds: int, ops, degrees) -> dict[int, list]:
    """``{n: sweep_on_rank's per-rank result on the first n ranks}`` for ``batches`` of ``(sizes_bytes, calls)``,
    its ``rounds`` spread over time: one pool call per round, batch and degree in turn, the sizes reversed
    every other round. A burst of other work then spoils a few rounds of every point, not every round of a
    few points, and the points compared with each other are measured side by side."""
    merged = {n: [{} for _ in range(ranks.world_size)] for n in degrees}
    for r in range(rounds):
        for sizes, calls in batches:
            for n in degrees:
                _merge(merged[n], ranks.run(sweep_on_rank, tuple(sizes)[::1 - 2 * (r % 2)], 1, calls, tuple(ops), n,
                                            r == 0))
    return {n: _rank_results(per_rank) for n, per_rank in merged.items()}


def run_calibration(ranks, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
                    latency_charge: str = "per_step", n_ranks: int | None = None, statistic: str = "fastest",
                    ops=SWEEP_OPS) -> Calibration:
    """Run ``sweep_on_rank`` for ``ops`` on ``ranks`` (a ``Ranks`` pool; on its first ``n_ranks`` ranks if
    given), its rounds spread over time (``_spread_sweep``), and fit this machine's latency and bandwidth to
    each point's ``statistic`` round: ``"fastest"`` (the floor: what the link costs when nothing else gets
    in the way) or ``"median"`` (the typical call). Every argument is checked before any rank runs."""
    if ranks.world_size < 2:
        raise ValueError(f"a communication sweep needs at least 2 ranks, got a pool of {ranks.world_size}")
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    ops = tuple(ops)
    if not ops or any(op not in SWEEP_OPS for op in ops):
        raise ValueError(f"the sweep times some of {', '.join(SWEEP_OPS)}; got {ops!r}")
    n = _group_size(ranks, n_ranks, "n_ranks")
    for name, value in (("rounds", rounds), ("calls", calls)):
        whole_number(value, name)
    check_sizes(sizes_bytes, n)
    start = time.perf_counter()
    per_rank = _spread_sweep(ranks, [(sizes_bytes, calls)], rounds, ops, (n,))[n]
    samples = STATISTICS[statistic](per_rank, n)
    per_op = {op: fit_link([s for s in samples if s.op == op], latency_charge) for op in ops}
    overall = fit_link(samples, latency_charge)
    return Calibration(tuple(samples), overall, per_op, time.perf_counter() - start, latency_charge, ranks.backend)


# -- decode against prefill, measured ------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeVsPrefillRun:
    """All-reduces of ``model``'s activations for each count of ``tokens`` (one token: a decode step; thousands:
    a prefill), at each tp degree: ``samples`` holds each point's median round (slowest rank), ``floors`` its
    fastest, and ``link`` predicts each through the alpha-beta formula, charging latency per ``latency_charge``.

    ``measured_s`` is the fastest round, set against a fit to fastest rounds: floor against floor (other
    work only ever adds time); ``typical_s`` the median, which also counts how busy the machine was."""

    model: ModelConfig
    link: Link
    latency_charge: str
    tokens: tuple[int, ...]
    tp_degrees: tuple[int, ...]
    samples: tuple[Sample, ...]
    wall_s: float = 0.0
    floors: tuple[Sample, ...] = ()

    def size_bytes(self, tokens: int) -> int:
        return int(tokens * self.model.d_model * self.model.bytes_per_param)

    def _point(self, pool, tp: int, tokens: int) -> float:
        size = self.size_bytes(tokens)
        return next(s.seconds for s in pool if s.n_ranks == tp and s.size_bytes == size)

    def measured_s(self, tp: int, tokens: int) -> float:  # the fastest round (the median if no floors were kept)
        return self._point(self.floors or self.samples, tp, tokens)

    def typical_s(self, tp: int, tokens: int) -> float:  # the median round
        return self._point(self.samples, tp, tokens)

    def predicted_terms_s(self, tp: int, tokens: int) -> tuple[float, float]:
        """``(latency part, bandwidth part)`` of the prediction."""
        return collective_terms_s("all_reduce", self.size_bytes(tokens), tp, self.link, self.latency_charge)

    def predicted_s(self, tp: int, tokens: int) -> float:
        return sum(self.predicted_terms_s(tp, tokens))

    def neighbours_s(self, tp: int, tokens: int) -> float:
        """The point's time as a fit of the *other* points of this run at ``tp`` predicts it (leave one
        out): the alpha-beta formula with a latency and a bandwidth measured in the same rounds, on the same
        ranks, the point itself not among them. Needs two other message sizes."""
        size = self.size_bytes(tokens)
        others = [s for s in (self.floors or self.samples) if s.n_ranks == tp and s.size_bytes != size]
        fit = fit_link(others, self.latency_charge)
        return collective_time_s("all_reduce", size, tp, fit.link(), self.latency_charge)

    def ratio(self, tp: int, tokens: int) -> float:
        """Measured over predicted."""
        return self.measured_s(tp, tokens) / self.predicted_s(tp, tokens)

    def within(self, band: float, tp_degrees=None, tokens=None, bound: str | None = None) -> bool:
        """Whether every point (of ``tp_degrees``, of ``tokens`` and of ``bound``, ``"latency"`` or
        ``"bandwidth"``, where given) measured within ``band`` times its prediction, either way."""
        return all(1 / band <= self.ratio(tp, t) <= band for tp in (tp_degrees or self.tp_degrees)
                   for t in (tokens or self.tokens) if bound is None or self.bound(tp, t) == bound)

    def bound(self, tp: int, tokens: int) -> str:
        """``"latency"`` or ``"bandwidth"``: which part of the prediction is larger."""
        latency, bandwidth = self.predicted_terms_s(tp, tokens)
        return "latency" if latency >= bandwidth else "bandwidth"

    def format(self) -> str:
        """A row per message: its size, then per tp degree the fastest round (median), prediction, ratio."""
        head = "".join(f"{'tp = ' + str(tp) + ': fastest (median)   predicted  ratio':>50}" for tp in self.tp_degrees)
        lines = [f"{'tokens':>7} {'bytes':>12}{head}"]
        for t in self.tokens:
            cells = "".join(f"{self.measured_s(tp, t) * 1e3:>16.3f} ms ({self.typical_s(tp, t) * 1e3:>7.3f}) "
                            f"{self.predicted_s(tp, t) * 1e3:>8.3f} ms {self.ratio(tp, t):>6.2f}"
                            for tp in self.tp_degrees)
            lines.append(f"{t:>7,} {self.size_bytes(t):>12,}{cells}")
        return "\n".join(lines)


CALL_BUDGET_BYTES = 2 * 2 ** 20  # calls per round for a large message: as many as fit 2 MiB, at least 1


def run_decode_vs_prefill(ranks, link: Link, model: ModelConfig = LLAMA_3_8B, tokens=(1, 16, 256, 2048),
                          tp_degrees=(2, 4), rounds: int = 7, calls: int = 8,
                          latency_charge: str = "per_step") -> DecodeVsPrefillRun:
    """Time one all-reduce of ``tokens x d_model`` activations of ``model`` (its own bytes per value) on
    the first ``tp`` ranks of ``ranks`` for each degree in ``tp_degrees``: ``rounds`` rounds of ``calls``
    calls back to back (fewer for large messages: as many as fit ``CALL_BUDGET_BYTES``), every size and
    degree in turn within each round (``_spread_sweep``); the median and the fastest round kept. Every
    argument is checked before any rank runs."""
    if latency_charge not in LATENCY_CHARGES:
        raise ValueError(f"latency_charge must be one of {', '.join(LATENCY_CHARGES)}, got {latency_charge!r}")
    tokens = tuple(whole_number(t, "tokens (per message)") for t in tokens)
    degrees = tuple(_group_size(ranks, tp, "tp") for tp in tp_degrees)
    if not tokens or not degrees:
        raise ValueError("give at least one token count and one tp degree")
    for name, value in (("rounds", rounds), ("calls", calls)):
        whole_number(value, name)
    sizes = [int(t * model.d_model * model.bytes_per_param) for t in tokens]
    for tp in degrees:
        check_sizes(sizes, tp)
    by_calls: dict[int, list[int]] = {}
    for size in sizes:
        by_calls.setdefault(max(1, min(calls, CALL_BUDGET_BYTES // size)), []).append(size)
    start = time.perf_counter()
    per_degree = _spread_sweep(ranks, [(group, n) for n, group in by_calls.items()], rounds, ("all_reduce",), degrees)
    medians = [s for tp, per_rank in per_degree.items() for s in median_of_slowest(per_rank, tp)]
    floors = [s for tp, per_rank in per_degree.items() for s in fastest_of_slowest(per_rank, tp)]
    return DecodeVsPrefillRun(model, link, latency_charge, tokens, degrees, tuple(medians),
                              time.perf_counter() - start, tuple(floors))


@dataclass(frozen=True)
class SlowRankRun:
    """``per_rank[r]``: rank ``r``'s ``ranks.SlowRankTimes``: ``step_s[op]`` (from leaving the barrier to
    the collective's end) and ``collective_s[op]`` (inside it) for each op of ``ranks.SLOW_RANK_OPS``."""

    slow_rank: int
    delay_s: float
    per_rank: tuple[SlowRankTimes, ...]
    spans: tuple = ()

    @property
    def ops(self) -> list[str]:
        return list(self.per_rank[0].step_s)

    def step_s(self, op: str) -> float:
        """The step of ``op``: it ends for everybody when the slowest rank is done."""
        return max(res.step_s[op] for res in self.per_rank)

    def inside_s(self, rank: int) -> float:
        """Seconds ``rank`` spent inside collectives, over every op."""
        return sum(self.per_rank[rank].collective_s.values())


def run_slow_rank(ranks, slow_rank: int, delay_s: float) -> SlowRankRun:
    """Rank ``slow_rank`` sleeps ``delay_s`` before each collective of ``SLOW_RANK_OPS``."""
    per_rank = ranks.run(slow_rank_on_rank, slow_rank, delay_s)
    return SlowRankRun(slow_rank, delay_s, tuple(per_rank), tuple(ranks.last_spans))


def serving_model(n_layers: int = 4, d_model: int = 512, d_ff: int = 2048) -> ModelConfig:
    """The serving demo's stack: ``n_layers`` of the toy's MLP layers, float32 (heads unused), wide enough
    that arithmetic, not Python's overhead per call, sets a step's time."""
    return ModelConfig("serving stack", n_layers=n_layers, d_model=d_model, n_heads=1, n_kv_heads=1, d_ff=d_ff,
                       vocab_size=1, bytes_per_param=4.0)


@dataclass(frozen=True)
class ReplicasVsTPRun:
    """Both ways of serving on ``tp`` ranks, ``measured`` (the median step of each way, a step ending
    when the group's slowest rank is done) and ``predicted`` by the cost model from the replicas' measured
    step and the link's all-reduce time, each a ``predict.ReplicasVsTensorParallel`` (latency per token:
    the step; tokens per second, in all and per device). ``max_output_gap``: the largest difference
    between the tensor-parallel outputs and rank 0's replica, which served the same requests."""

    model: ModelConfig
    measured: ReplicasVsTensorParallel
    predicted: ReplicasVsTensorParallel
    tp_all_reduce_s_per_step: float  # measured: time inside the all-reduces (moving bytes, and waiting)
    predicted_comm_s_per_step: float
    max_output_gap: float
    replica_steps_s: tuple[float, ...] = ()  # every measured step, slowest rank
    tp_steps_s: tuple[float, ...] = ()

    @property
    def tp(self) -> int:
        return self.measured.world_size

    @property
    def tp_step_ratio(self) -> float:
        """The tensor-parallel step, measured over predicted."""
        return self.measured.tp_step_s / self.predicted.tp_step_s


def run_replicas_vs_tp(ranks, link: Link, model: ModelConfig | None = None, batch: int = 8, steps: int = 12,
                       seed: int = 0, latency_charge: str = "per_step", tp: int | None = None) -> ReplicasVsTPRun:
    """Serve on the first ``tp`` ranks of ``ranks`` (all of them by default) both ways, step by step in turn
    (``serve_both_ways_on_rank``), so both see the same machine load; medians of ``steps`` steps.

    The prediction takes the replicas' measured step (the whole compute, ``C``) and ``link``'s all-reduce
    time: a tensor-parallel step is ``C / tp`` plus one all-reduce of ``batch x d_model`` float32 values
    per layer."""
    model = serving_model() if model is None else model
    n = _group_size(ranks, tp, "tp")
    if model.d_ff % n:
        raise ValueError(f"d_ff = {model.d_ff} cannot be split {n} ways")
    for name, value in (("batch", batch), ("steps", steps)):
        whole_number(value, name)
    got = on_ranks(ranks, serve_both_ways_on_rank, model, seed, batch, steps, tp)
    replica_steps, tp_steps = got.across("replica_s", max), got.across("tp_s", max)  # the group's slowest rank
    reduce_s = statistics.median(got.across("all_reduce_s", max))
    replica_step_s, tp_step_s = statistics.median(replica_steps), statistics.median(tp_steps)
    comm_per_step_s = model.n_layers * all_reduce_s(batch * model.d_model * 4, n, link, latency_charge)
    gap = got.max_gap("tp_outputs", got.first("replica_outputs"))
    measured = ReplicasVsTensorParallel(n, batch, replica_step_s, tp_step_s)
    predicted = replicas_vs_tensor_parallel(replica_step_s, comm_per_step_s, n, batch)
    return ReplicasVsTPRun(model, measured, predicted, reduce_s, comm_per_step_s, gap, replica_steps, tp_steps)
