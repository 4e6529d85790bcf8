"""A request's latency (``RequestMetrics``: TTFT, TPOT, end to end, its longest stall), and goodput: how many
requests a second a deployment serves within its latency objectives.

Zhong et al. 2024 (DistServe): a request meets its service-level objectives when its time to first token
is within ``ttft_s`` and its time per output token within ``tpot_s``; *SLO attainment* is the share of
requests that meet both; *goodput* is the highest request rate whose attainment is at least ``share``
(90 % in DistServe's figures), and goodput per GPU divides it by the GPUs serving. Throughput counts every
token; goodput counts only the requests served in time, so a deployment can have more of the first and
less of the second. A request with one token has no TPOT: it meets that objective. Pure: no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from shardlib.core.checks import is_number, positive_number, whole_number
from shardlib.core.serving.requests import Request


@dataclass(frozen=True)
class RequestMetrics:
    """One request's times, seconds: ``ttft_s`` (arrival to first token), ``tpot_s`` (mean gap between its
    later tokens; 0 with one token), ``e2e_s`` (arrival to last token), ``max_gap_s`` (its longest wait
    between two tokens: a generation stall shows here)."""

    arrival_s: float
    ttft_s: float
    tpot_s: float
    e2e_s: float
    max_gap_s: float
    preemptions: int


def request_metrics(request: Request, times, preemptions: int = 0) -> RequestMetrics:
    """A request's metrics from its token times (seconds after the start)."""
    gaps = [b - a for a, b in zip(times, times[1:])]
    return RequestMetrics(request.arrival_s, times[0] - request.arrival_s,
                          (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0,
                          times[-1] - request.arrival_s, max(gaps, default=0.0), preemptions)


def percentile(values, q: float) -> float:
    """The ``q``-th percentile (0 to 100) of ``values``, nearest rank."""
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


@dataclass(frozen=True)
class ServingObjective:
    """The latency a request must meet: TTFT at most ``ttft_s``, TPOT at most ``tpot_s`` (seconds), for at
    least ``share`` of the requests."""

    ttft_s: float
    tpot_s: float
    share: float = 0.9
    name: str = ""

    def __post_init__(self) -> None:
        positive_number(self.ttft_s, "ttft_s")
        positive_number(self.tpot_s, "tpot_s")
        if not is_number(self.share) or not 0 < self.share <= 1:
            raise ValueError(f"share must be a fraction of the requests in (0, 1], got {self.share!r} "
                             "(DistServe uses 0.9)")

    @property
    def label(self) -> str:
        return self.name or f"TTFT <= {self.ttft_s * 1e3:.3g} ms, TPOT <= {self.tpot_s * 1e3:.3g} ms"

    def met(self, metric: RequestMetrics) -> bool:
        """Whether one request met both objectives."""
        return metric.ttft_s <= self.ttft_s and metric.tpot_s <= self.tpot_s


def _metrics(metrics) -> list:
    values = list(metrics.values()) if isinstance(metrics, Mapping) else list(metrics)
    if not values:
        raise ValueError("SLO attainment needs the metrics of at least one request")
    return values


def slo_attainment(metrics, objective: ServingObjective) -> float:
    """The share of requests (``RequestMetrics``, a list or a dict by request id) meeting both objectives."""
    values = _metrics(metrics)
    return sum(objective.met(m) for m in values) / len(values)


def goodput(metrics_by_rate: Mapping[float, Sequence], objective: ServingObjective, gpus: int = 1) -> float:
    """Requests a second per GPU: the highest rate of ``metrics_by_rate`` (rate -> the requests' metrics
    served at that rate) whose SLO attainment, and that of every lower rate given, is at least
    ``objective.share``, divided by ``gpus``; 0 when even the lowest rate misses it. Reading the rates
    from the lowest up keeps one lucky high rate from counting past a miss below it."""
    whole_number(gpus, "gpus")
    if not metrics_by_rate:
        raise ValueError("goodput needs at least one request rate and its metrics")
    best = 0.0
    for rate in sorted(metrics_by_rate):
        positive_number(rate, "request rates")
        if slo_attainment(metrics_by_rate[rate], objective) < objective.share:
            break
        best = float(rate)
    return best / gpus
