"""Decode against prefill, measured: all-reduces of one token's activations and of thousands, at tp = 2 and 4.

The points are swept as the calibration sweeps (``calibration.sweep``): every size and degree in turn within
each round. Each keeps its fastest round, set against the alpha-beta prediction of a link fitted to fastest
rounds (other work only ever adds time), its median round beside it. A decode step is latency-bound, a
prompt bandwidth-bound: ``decode_vs_prefill_verdicts`` states both in numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import LATENCY_CHARGES, Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.calibration import group_size, sweep
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.alpha_beta import (
    Sample,
    check_sizes,
    collective_terms_s,
    collective_time_s,
    fit_link,
    slowest_samples,
)

CALL_BUDGET_BYTES = 2 * 2 ** 20  # calls per round for a large message: as many as fit 2 MiB, at least 1
BANDWIDTH_BAND, LATENCY_BAND = 2.0, 3.0  # at tp = 2: bandwidth- and latency-bound points
DECODE_GROWTH_AT_MOST = 4.0  # 8x the tokens of a decode step costs less than 4x the time
PREFILL_GROWTH_AT_LEAST = 2.5  # 8x the tokens of a prompt costs more than 2.5x the time


@dataclass(frozen=True)
class DecodeVsPrefillRun:
    """All-reduces of ``model``'s activations per count of ``tokens`` at each tp degree: each point's fastest
    round (``floors``, slowest rank) against ``link``, its median round (``medians``) beside it."""

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
    calls back to back (fewer for large messages: as many as fit ``CALL_BUDGET_BYTES``)."""
    if latency_charge not in LATENCY_CHARGES:
        raise ValueError(f"latency_charge must be one of {', '.join(LATENCY_CHARGES)}, got {latency_charge!r}")
    tokens = tuple(whole_number(t, "tokens (per message)") for t in tokens)
    degrees = tuple(group_size(ranks, tp, "tp") for tp in tp_degrees)
    if not tokens or not degrees:
        raise ValueError("give at least one token count and one tp degree")
    whole_number(rounds, "rounds"), whole_number(calls, "calls")
    sizes = [int(t * model.d_model * model.bytes_per_param) for t in tokens]
    for tp in degrees:
        check_sizes(sizes, tp)
    points = [("all_reduce", size, max(1, min(calls, CALL_BUDGET_BYTES // size))) for size in sizes]
    per_degree = sweep(ranks, points, rounds, degrees)
    floors = [s for tp, per_rank in per_degree.items() for s in slowest_samples(per_rank, tp)]
    medians = [s for tp, per_rank in per_degree.items() for s in slowest_samples(per_rank, tp, "median")]
    return DecodeVsPrefillRun(model, link, latency_charge, tokens, degrees, tuple(floors), tuple(medians))


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
                                attempts: int = 3, **kwargs) -> tuple[DecodeVsPrefillRun, tuple[Verdict, ...]]:
    """``run_decode_vs_prefill`` (arguments as it takes them), measured again while a verdict does not hold.
    ``tokens``: the two smallest counts are the decode steps compared, the two largest the prompts."""
    tokens = tuple(sorted(tokens))
    if len(set(tokens)) < 4:
        raise ValueError(f"the check compares two decode steps and two prompts, and judges each latency-bound "
                         f"point against the others: give at least 4 different token counts, got {tokens}")
    return verified(lambda: run_decode_vs_prefill(ranks, link, model, tokens, **kwargs), decode_vs_prefill_verdicts,
                    attempts)
