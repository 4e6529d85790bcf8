"""Notebook 02's measured claims: each ``run_*_check`` returns ``(run, verdicts)``, a measurement from
``drivers`` and its verdicts (``lab.verdict``), the bands worked by its ``*_verdicts`` function.

Each measures through ``verified``: again, at most ``attempts`` times, while a verdict does not hold, since
a busy machine only ever slows a run. The notebook prints ``v.line`` for each verdict and folds
the bands below in a "How this was measured" block.
"""

from __future__ import annotations

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
from shardlib.predict.alpha_beta import Calibration, collective_time_s

CHECK_ATTEMPTS = 3
GROWTH_AT_LEAST = 2.0  # the largest message of a sweep takes at least twice the smallest's time
BANDWIDTH_BAND, LATENCY_BAND = 2.0, 3.0  # decode vs prefill at tp = 2: bandwidth- and latency-bound points
DECODE_GROWTH_AT_MOST = 4.0  # 8x the tokens of a decode step costs less than 4x the time
PREFILL_GROWTH_AT_LEAST = 2.5  # 8x the tokens of a prompt costs more than 2.5x the time
SLOW_STEP_LOW, SLOW_WAIT_LOW, SLOW_HIGH = 0.8, 0.5, 4.0  # a slow rank: steps and the fast ranks' wait
SERVING_BAND = 2.0  # replicas against a split copy: measured within 2x of the prediction


def calibration_verdicts(cal: Calibration) -> tuple[Verdict, ...]:
    """Per operation of ``cal``: its largest message took at least ``GROWTH_AT_LEAST`` times its smallest's
    (bytes cost time), the operation's own fit's ratio beside it for scale."""
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


def run_calibration_check(ranks, n_ranks: int = 2, attempts: int = CHECK_ATTEMPTS,
                          **kwargs) -> tuple[Calibration, tuple[Verdict, ...]]:
    """``run_calibration`` on the first ``n_ranks`` ranks (fastest rounds; other arguments as it takes them),
    measured again while a verdict of ``calibration_verdicts`` does not hold."""
    kwargs.setdefault("statistic", "fastest")
    return verified(lambda: run_calibration(ranks, n_ranks=n_ranks, **kwargs), calibration_verdicts, attempts)


def _tokens(count: int) -> str:
    return f"{count:,} token{'' if count == 1 else 's'}"


def decode_vs_prefill_verdicts(run: DecodeVsPrefillRun) -> tuple[Verdict, ...]:
    """The verdicts of a ``DecodeVsPrefillRun``, on fastest rounds. At tp = 2, each bandwidth-bound point
    against the calibration within ``BANDWIDTH_BAND``, each latency-bound one against a fit of the run's
    other points at tp = 2 (``neighbours_s``: the machine's delays drift between cells) within
    ``LATENCY_BAND``. Per degree, one-sided: the decode step's growth under ``DECODE_GROWTH_AT_MOST``, the
    prompt's over ``PREFILL_GROWTH_AT_LEAST``. One token at the larger degree slower than at the smaller
    (no band: 4 ranks on 2 cores wait for parked ranks). Notebook 02 says why each band."""
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

    def growth(what: str, tp: int, t0: int, t1: int, small: int | None = None, **claim) -> Verdict:
        small = tp if small is None else small
        return Verdict.one_sided(what, run.predicted_s(tp, t1) / run.predicted_s(small, t0),
                                 run.measured_s(tp, t1) / run.measured_s(small, t0), "x", **claim)

    if len(run.tokens) >= 4:
        (d0, d1), (p0, p1) = run.tokens[:2], run.tokens[-2:]
        for tp in run.tp_degrees:
            out.append(growth(f"tp = {tp}: decode, {d1:,} tokens over {d0:,}", tp, d0, d1,
                              at_most=DECODE_GROWTH_AT_MOST))
            out.append(growth(f"tp = {tp}: prefill, {p1:,} tokens over {p0:,}", tp, p0, p1,
                              at_least=PREFILL_GROWTH_AT_LEAST))
    if len(run.tp_degrees) >= 2:
        large, t = max(run.tp_degrees), run.tokens[0]
        out.append(growth(f"{_tokens(t)}: tp = {large} over tp = {smallest}", large, t, t, smallest, at_least=1.0))
    return tuple(out)


def run_decode_vs_prefill_check(ranks, link: Link, model: ModelConfig = LLAMA_3_8B, tokens=(1, 8, 256, 2048),
                                attempts: int = CHECK_ATTEMPTS,
                                **kwargs) -> tuple[DecodeVsPrefillRun, tuple[Verdict, ...]]:
    """``run_decode_vs_prefill`` (arguments as it takes them), measured again while a verdict of
    ``decode_vs_prefill_verdicts`` does not hold. ``tokens``: the two smallest counts are the decode
    steps compared, the two largest the prompts (measured in increasing order)."""
    tokens = tuple(sorted(tokens))
    if len(set(tokens)) < 4:
        raise ValueError(f"the check compares two decode steps and two prompts, and judges each latency-bound "
                         f"point against the others: give at least 4 different token counts, got {tokens}")
    return verified(lambda: run_decode_vs_prefill(ranks, link, model, tokens, **kwargs), decode_vs_prefill_verdicts,
                    attempts)


def slow_rank_verdicts(run: SlowRankRun) -> tuple[Verdict, ...]:
    """Against the slow rank's sleeps, summed: the fastest rank's steps (every rank takes the slow one's
    time: from ``SLOW_STEP_LOW`` of it), and a fast rank's time inside the collectives beyond the slow
    rank's (the fast ranks do the waiting: from ``SLOW_WAIT_LOW``); each at most ``SLOW_HIGH`` times."""
    sleeps = len(run.ops) * run.delay_s
    fast = 1 if run.slow_rank == 0 else 0
    fastest_steps = sum(min(run.steps_s(op)) for op in run.ops)
    waited = run.inside_s(fast) - run.inside_s(run.slow_rank)
    return (Verdict(f"the fastest rank's {len(run.ops)} steps", sleeps, fastest_steps, "s", SLOW_STEP_LOW, SLOW_HIGH),
            Verdict(f"rank {fast}'s wait inside them, beyond rank {run.slow_rank}'s", sleeps, max(waited, 1e-12), "s",
                    SLOW_WAIT_LOW, SLOW_HIGH))


def run_slow_rank_check(ranks, slow_rank: int, delay_s: float,
                        attempts: int = CHECK_ATTEMPTS) -> tuple[SlowRankRun, tuple[Verdict, ...]]:
    """``run_slow_rank``, measured again while a verdict of ``slow_rank_verdicts`` does not hold."""
    if not delay_s > 0:
        raise ValueError(f"a slow-rank check needs a delay above 0 s to set the steps beside, got {delay_s}")
    if ranks.world_size < 2:
        raise ValueError(f"a slow rank needs others to wait for it: a pool of {ranks.world_size} rank has none")
    return verified(lambda: run_slow_rank(ranks, slow_rank, delay_s), slow_rank_verdicts, attempts)


def replicas_vs_tp_verdicts(run: ReplicasVsTPRun) -> tuple[Verdict, ...]:
    """Within ``SERVING_BAND`` of the cost model: the tensor-parallel step; its latency per token over a
    replica's (under 1 too: it answers sooner); the replicas' tokens per second over its own (over 1 too:
    replicas serve more at the same batch). Reads ``run.measured`` and ``run.predicted`` alone."""
    measured, predicted = run.measured, run.predicted
    tp = measured.world_size
    return (Verdict(f"the tp = {tp} step", predicted.tp_step_s, measured.tp_step_s, "s",
                    1 / SERVING_BAND, SERVING_BAND),
            Verdict.one_sided(f"latency per token, tp = {tp} over a replica", predicted.latency_ratio,
                              measured.latency_ratio, "x", at_most=1.0, within=SERVING_BAND),
            Verdict.one_sided(f"tokens per second per device, replicas over tp = {tp}",
                              predicted.throughput_ratio, measured.throughput_ratio, "x", at_least=1.0,
                              within=SERVING_BAND))


def run_replicas_vs_tp_check(ranks, link: Link, attempts: int = CHECK_ATTEMPTS,
                             **kwargs) -> tuple[ReplicasVsTPRun, tuple[Verdict, ...]]:
    """``run_replicas_vs_tp`` (arguments as it takes them), measured again while a verdict of
    ``replicas_vs_tp_verdicts`` does not hold."""
    return verified(lambda: run_replicas_vs_tp(ranks, link, **kwargs), replicas_vs_tp_verdicts, attempts)
