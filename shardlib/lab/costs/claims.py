"""Notebook 02's measured claims, each a measurement from ``drivers`` with its verdicts (``lab.verdict``).

Each ``run_*_check`` measures through ``verified``: again, at most ``attempts`` times, while a verdict does not
hold, since a busy machine only ever slows a run. The notebook prints ``v.line`` for each of ``.verdicts``
and folds the bands below in a "How this was measured" block.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.drivers import (
    DecodeVsPrefillRun,
    ReplicasVsTPRun,
    SlowRankRun,
    run_calibration,
    run_decode_vs_prefill,
    run_replicas_vs_tp,
    run_slow_rank,
)
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.alpha_beta import collective_time_s
from shardlib.predict.calibration import Calibration

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
