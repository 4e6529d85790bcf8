"""Communication costs measured on a pool, each beside its prediction.

* ``run_calibration``: this machine's latency and bandwidth, fitted to a sweep of message sizes whose rounds
  ``_spread_sweep`` spreads over time, every size in turn, so a burst of other work spoils no point alone.
* ``run_decode_vs_prefill``: all-reduces of one token (decode) and of thousands (prefill) at tp = 2 and 4,
  fastest rounds (medians beside them) against the prediction of a link fitted to fastest rounds.
* ``run_slow_rank``: one rank delayed; how long every rank then spends inside each collective.
* ``run_replicas_vs_tp``: replicas against one tensor-parallel copy, step by step in turn.
* ``run_*_check``: each of those with its ``verdicts`` (``runtime.verdict``), the lines notebook 02 prints.

A pool larger than the group a measurement needs runs it on its first ranks (``ranks.leading_group``).
One idea: how this package's measurements are run on a pool and judged against their predictions; each
``run_*_check`` sits beside the driver whose result it judges.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from ..checks import whole_number
from ..hardware import LATENCY_CHARGES, Link
from ..models import LLAMA_3_8B, ModelConfig
from ..runtime.gather import gather
from ..runtime.verdict import Verdict, verified
from .alpha_beta import all_reduce_s, collective_terms_s, collective_time_s
from .calibration import (
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
from .predict import ReplicasVsTensorParallel, replicas_vs_tensor_parallel
from .ranks import SlowRankTimes, serve_both_ways_on_rank, slow_rank_on_rank, sweep_on_rank

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


def measure_until(measure, accept, attempts: int = 3):
    """``(result, attempt)``: ``measure()`` run up to ``attempts`` times, stopping at the first result that
    ``accept(result)`` takes (else the last). A retry that says how many attempts it took hides nothing."""
    whole_number(attempts, "attempts")
    for attempt in range(1, attempts + 1):
        result = measure()
        if accept(result):
            break
    return result, attempt


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
    got = gather(ranks.run(serve_both_ways_on_rank, model, seed, batch, steps, tp))
    replica_steps, tp_steps = got.across("replica_s", max), got.across("tp_s", max)  # the group's slowest rank
    reduce_s = statistics.median(got.across("all_reduce_s", max))
    replica_step_s, tp_step_s = statistics.median(replica_steps), statistics.median(tp_steps)
    comm_per_step_s = model.n_layers * all_reduce_s(batch * model.d_model * 4, n, link, latency_charge)
    gap = got.max_gap("tp_outputs", got.first("replica_outputs"))
    measured = ReplicasVsTensorParallel(n, batch, replica_step_s, tp_step_s)
    predicted = replicas_vs_tensor_parallel(replica_step_s, comm_per_step_s, n, batch)
    return ReplicasVsTPRun(model, measured, predicted, reduce_s, comm_per_step_s, gap, replica_steps, tp_steps)


# -- the notebook's claims: each measurement with its verdicts ------------------------------------------------
# Every ``run_*_check`` below measures through ``runtime.verdict.verified``: measured again (at most
# ``attempts`` times) while a verdict does not hold, since a busy machine only ever slows a run; under a
# test run or CI a verdict that never held raises with its numbers. The notebook prints ``v.line`` for
# each of ``.verdicts`` and folds the bands below in a "How this was measured" block.
CHECK_ATTEMPTS = 3
GROWTH_AT_LEAST = 2.0  # the largest message of a sweep takes at least twice the smallest's time
BANDWIDTH_BAND, LATENCY_BAND = 2.0, 3.0  # decode vs prefill at tp = 2: bandwidth- and latency-bound points
DECODE_GROWTH_AT_MOST = 4.0  # 8x the tokens of a decode step costs less than 4x the time
PREFILL_GROWTH_AT_LEAST = 2.5  # 8x the tokens of a prompt costs more than 2.5x the time
SLOW_STEP_LOW, SLOW_WAIT_LOW, SLOW_HIGH = 0.8, 0.5, 4.0  # a slow rank: steps and the fast ranks' wait
SERVING_BAND = 2.0  # replicas against a split copy: measured within 2x of the prediction


@dataclass(frozen=True)
class CalibrationCheck:
    """``calibration`` (``run_calibration``'s fit of this machine's latency and bandwidth) and its
    ``verdicts``: per operation, how many times longer its largest message took than its smallest,
    measured against what the operation's own fit predicts. The claim is that bytes cost time: at least
    ``GROWTH_AT_LEAST`` times longer (one-sided: the fit's ratio is shown for scale)."""

    calibration: Calibration
    verdicts: tuple[Verdict, ...]

    @property
    def link(self) -> Link:
        """The all-reduce's own fit: what every all-reduce after the sweep is predicted with."""
        return self.calibration.op_link("all_reduce")


def calibration_verdicts(cal: Calibration) -> tuple[Verdict, ...]:
    """Per operation of ``cal``: its largest message's time over its smallest's, measured against its fit."""
    out = []
    for op, fit in cal.per_op.items():
        mine = sorted((s for s in cal.samples if s.op == op), key=lambda s: s.size_bytes)
        small, large = mine[0], mine[-1]
        link = fit.link()
        predicted = (collective_time_s(op, large.size_bytes, large.n_ranks, link, cal.latency_charge)
                     / collective_time_s(op, small.size_bytes, small.n_ranks, link, cal.latency_charge))
        what = f"{op.replace('_', '-')}, {_size(large.size_bytes)} over {_size(small.size_bytes)}"
        out.append(Verdict.one_sided(what, predicted, large.seconds / small.seconds, "x", at_least=GROWTH_AT_LEAST))
    return tuple(out)


def _size(size_bytes: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale:,} {unit}"
    return f"{size_bytes:,} B"


def run_calibration_check(ranks, n_ranks: int = 2, attempts: int = CHECK_ATTEMPTS, **kwargs) -> CalibrationCheck:
    """``run_calibration`` on the first ``n_ranks`` ranks (fastest rounds; other arguments as it takes them),
    measured again while a verdict of ``calibration_verdicts`` does not hold."""
    kwargs.setdefault("statistic", "fastest")
    cal, verdicts = verified(lambda: run_calibration(ranks, n_ranks=n_ranks, **kwargs), calibration_verdicts,
                             attempts)
    return CalibrationCheck(cal, verdicts)


@dataclass(frozen=True)
class DecodeVsPrefillCheck:
    """``run`` (a ``DecodeVsPrefillRun``) and its ``verdicts``:

    * at tp = 2, each **bandwidth-bound** point (fastest round) against the calibration's prediction,
      within ``BANDWIDTH_BAND`` either way: a floor against a fit to floors;
    * at tp = 2, each **latency-bound** point against a fit of *the other points of the same run at the
      same degree* (``DecodeVsPrefillRun.neighbours_s``), within ``LATENCY_BAND``. A latency-bound point is
      a fraction of a millisecond, and the machine's scheduling delay can change between the calibration
      cell and this one (a 3.2x miss was seen on a loaded machine, the calibration having run while it
      was quieter). The points measured in the same rounds saw the same machine; the claim is the model's
      shape (one latency per ring step, bytes next to nothing), not the earlier cell's number;
    * per degree, the decode step's growth (less than ``DECODE_GROWTH_AT_MOST``: bytes do not decide it)
      and the prompt's (more than ``PREFILL_GROWTH_AT_LEAST``: bytes do), each measured ratio set beside
      the predicted one, one-sided;
    * one token at the larger degree over the smaller: more ring steps, more latencies. Only "slower" is
      claimed (no upper band): 4 ranks share 2 cores, so each step can wait for a parked rank.

    ``tp = 4`` points get no band against the 2-rank fit for the same reason."""

    run: DecodeVsPrefillRun
    verdicts: tuple[Verdict, ...]


def _tokens(count: int) -> str:
    return f"{count:,} token{'' if count == 1 else 's'}"


def decode_vs_prefill_verdicts(run: DecodeVsPrefillRun) -> tuple[Verdict, ...]:
    """The verdicts ``DecodeVsPrefillCheck`` describes, for ``run``."""
    out = []
    smallest = min(run.tp_degrees)
    if smallest == 2:
        for t in run.tokens:
            if run.bound(2, t) == "bandwidth":
                out.append(Verdict(f"tp = 2, {_tokens(t)}, against the calibration", run.predicted_s(2, t),
                                   run.measured_s(2, t), "s", 1 / BANDWIDTH_BAND, BANDWIDTH_BAND))
            else:
                out.append(Verdict(f"tp = 2, {_tokens(t)}, against this run's other points",
                                   run.neighbours_s(2, t), run.measured_s(2, t), "s", 1 / LATENCY_BAND, LATENCY_BAND))
    if len(run.tokens) >= 4:
        (d0, d1), (p0, p1) = run.tokens[:2], run.tokens[-2:]
        for tp in run.tp_degrees:
            out.append(Verdict.one_sided(f"tp = {tp}: decode, {d1:,} tokens over {d0:,}",
                                         run.predicted_s(tp, d1) / run.predicted_s(tp, d0),
                                         run.measured_s(tp, d1) / run.measured_s(tp, d0), "x",
                                         at_most=DECODE_GROWTH_AT_MOST))
            out.append(Verdict.one_sided(f"tp = {tp}: prefill, {p1:,} tokens over {p0:,}",
                                         run.predicted_s(tp, p1) / run.predicted_s(tp, p0),
                                         run.measured_s(tp, p1) / run.measured_s(tp, p0), "x",
                                         at_least=PREFILL_GROWTH_AT_LEAST))
    if len(run.tp_degrees) >= 2:
        small, large, t = smallest, max(run.tp_degrees), run.tokens[0]
        out.append(Verdict.one_sided(f"{_tokens(t)}: tp = {large} over tp = {small}",
                                     run.predicted_s(large, t) / run.predicted_s(small, t),
                                     run.measured_s(large, t) / run.measured_s(small, t), "x", at_least=1.0))
    return tuple(out)


def run_decode_vs_prefill_check(ranks, link: Link, model: ModelConfig = LLAMA_3_8B, tokens=(1, 8, 256, 2048),
                                attempts: int = CHECK_ATTEMPTS, **kwargs) -> DecodeVsPrefillCheck:
    """``run_decode_vs_prefill`` (arguments as it takes them), measured again while a verdict of
    ``decode_vs_prefill_verdicts`` does not hold. ``tokens``: the two smallest counts are the decode
    steps compared, the two largest the prompts (measured in increasing order)."""
    tokens = tuple(sorted(tokens))
    if len(set(tokens)) < 4:
        raise ValueError(f"the check compares two decode steps and two prompts, and judges each latency-bound "
                         f"point against the others: give at least 4 different token counts, got {tokens}")
    run, verdicts = verified(lambda: run_decode_vs_prefill(ranks, link, model, tokens, **kwargs),
                             decode_vs_prefill_verdicts, attempts)
    return DecodeVsPrefillCheck(run, verdicts)


@dataclass(frozen=True)
class SlowRankCheck:
    """``run`` (a ``SlowRankRun``) and its ``verdicts``: the fastest rank's steps, summed over the
    collectives, against the slow rank's sleeps (every rank takes the slow one's time: at least
    ``SLOW_STEP_LOW`` of it, since other work only adds to a sleep); and the time a fast rank spends inside
    the collectives beyond the slow rank's time there, against the same sleeps (the fast ranks do the
    waiting: at least ``SLOW_WAIT_LOW`` of it). Neither may pass ``SLOW_HIGH`` times the sleeps."""

    run: SlowRankRun
    verdicts: tuple[Verdict, ...]


def slow_rank_verdicts(run: SlowRankRun) -> tuple[Verdict, ...]:
    """The verdicts ``SlowRankCheck`` describes, for ``run``."""
    sleeps = len(run.ops) * run.delay_s
    fast = next(r for r in range(len(run.per_rank)) if r != run.slow_rank)
    fastest_steps = sum(min(res.step_s[op] for res in run.per_rank) for op in run.ops)
    waited = run.inside_s(fast) - run.inside_s(run.slow_rank)
    return (Verdict(f"the fastest rank's {len(run.ops)} steps", sleeps, fastest_steps, "s", SLOW_STEP_LOW, SLOW_HIGH),
            Verdict(f"rank {fast}'s wait inside them, beyond rank {run.slow_rank}'s", sleeps, max(waited, 1e-12), "s",
                    SLOW_WAIT_LOW, SLOW_HIGH))


def run_slow_rank_check(ranks, slow_rank: int, delay_s: float, attempts: int = CHECK_ATTEMPTS) -> SlowRankCheck:
    """``run_slow_rank``, measured again while a verdict of ``slow_rank_verdicts`` does not hold."""
    if not delay_s > 0:
        raise ValueError(f"a slow-rank check needs a delay above 0 s to set the steps beside, got {delay_s}")
    if ranks.world_size < 2:
        raise ValueError(f"a slow rank needs others to wait for it: a pool of {ranks.world_size} rank has none")
    run, verdicts = verified(lambda: run_slow_rank(ranks, slow_rank, delay_s), slow_rank_verdicts, attempts)
    return SlowRankCheck(run, verdicts)


@dataclass(frozen=True)
class ReplicasVsTPCheck:
    """``run`` (a ``ReplicasVsTPRun``) and its ``verdicts``, each measured against the cost model within
    ``SERVING_BAND`` either way: the tensor-parallel step; the split copy's latency per token over a
    replica's (which must also stay under 1: the split copy answers sooner); the replicas' tokens per
    second over the split copy's (which must also stay over 1: replicas serve more at the same batch)."""

    run: ReplicasVsTPRun
    verdicts: tuple[Verdict, ...]


def replicas_vs_tp_verdicts(run: ReplicasVsTPRun) -> tuple[Verdict, ...]:
    """The verdicts ``ReplicasVsTPCheck`` describes, for ``run``."""
    measured, predicted = run.measured, run.predicted
    return (Verdict(f"the tp = {run.tp} step", predicted.tp_step_s, measured.tp_step_s, "s",
                    1 / SERVING_BAND, SERVING_BAND),
            Verdict.one_sided(f"latency per token, tp = {run.tp} over a replica", predicted.latency_ratio,
                              measured.latency_ratio, "x", at_most=1.0, within=SERVING_BAND),
            Verdict.one_sided(f"tokens per second per device, replicas over tp = {run.tp}",
                              predicted.throughput_ratio, measured.throughput_ratio, "x", at_least=1.0,
                              within=SERVING_BAND))


def run_replicas_vs_tp_check(ranks, link: Link, attempts: int = CHECK_ATTEMPTS, **kwargs) -> ReplicasVsTPCheck:
    """``run_replicas_vs_tp`` (arguments as it takes them), measured again while a verdict of
    ``replicas_vs_tp_verdicts`` does not hold."""
    run, verdicts = verified(lambda: run_replicas_vs_tp(ranks, link, **kwargs), replicas_vs_tp_verdicts, attempts)
    return ReplicasVsTPCheck(run, verdicts)
