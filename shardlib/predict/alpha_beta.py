"""The alpha-beta model: each collective's time from a link's latency and bandwidth, and the fit of both.

A message of ``S`` bytes costs ``alpha + S / bandwidth`` (Hockney 1994); a collective is a sequence of
such messages (Thakur, Rabenseifner and Gropp 2005, "Optimization of Collective Communication
Operations in MPICH"; the bandwidth-optimal ring all-reduce of Patarasuk and Yuan 2009, written out in
``core.collectives``):

    all-reduce       2(n-1) alpha + 2(n-1)/n * S / bandwidth
    all-gather, reduce-scatter, all-to-all   (n-1) alpha + (n-1)/n * S / bandwidth
    point-to-point        alpha   +        S / bandwidth

``S`` is the buffer one rank works on (``runtime.records``, as nccl-tests counts), ``bandwidth`` the rate
one way (``hardware.Link.one_way_bytes_per_s``). ``latency_charge``: ``"per_step"`` pays ``alpha`` at
every ring step, ``"per_call"`` once per collective. ``fit_link`` solves these formulas for ``alpha`` and
``1 / bandwidth`` by least squares over measured ``Sample``s, in relative errors, so small messages weigh
as much as large ones; its quality is R squared of log(time). Pure: no torch.
"""


from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlib.core.checks import choice, positive_number, whole_number
from shardlib.facts.hardware import LATENCY_CHARGES, Link

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "point_to_point")


# -- collectives ------------------------------------------------------------------------------------------
def cost_terms(op: str, world_size: int, latency_charge: str = "per_step") -> tuple[int, float]:
    """``(latency_steps, bandwidth_factor)`` of ``op`` on ``world_size = n`` ranks: the time is
    ``latency_steps * alpha + bandwidth_factor * size_bytes / bandwidth``. One rank: ``(0, 0.0)``.

    ``bandwidth_factor`` is also nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for all-reduce,
    ``(n-1)/n`` for all-gather, reduce-scatter and all-to-all, 1 for point-to-point.
    """
    choice(op, COLLECTIVE_OPS, "operation")
    choice(latency_charge, LATENCY_CHARGES, "latency_charge")
    if op == "point_to_point":
        return 1, 1.0
    n = whole_number(world_size, "world_size (the ranks of the collective)")
    if n == 1:
        return 0, 0.0  # one rank already holds everything: nothing to send
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    factor = steps / n
    return (1 if latency_charge == "per_call" else steps), factor


def collective_terms_s(op: str, size_bytes: float, world_size: int, link: Link,
                       latency_charge: str = "per_step") -> tuple[float, float]:
    """``(latency part, bandwidth part)`` of the time of ``op`` on ``size_bytes``, in seconds."""
    size_bytes = positive_number(size_bytes, "size_bytes")
    steps, factor = cost_terms(op, world_size, latency_charge)
    return steps * link.latency_s, factor * size_bytes / link.one_way_bytes_per_s


def collective_time_s(op: str, size_bytes: float, world_size: int, link: Link,
                      latency_charge: str = "per_step") -> float:
    """Predicted seconds for ``op`` on ``size_bytes`` over ``world_size`` ranks joined by ``link``."""
    return sum(collective_terms_s(op, size_bytes, world_size, link, latency_charge))


def all_reduce_s(size_bytes: float, world_size: int, link: Link, latency_charge: str = "per_step") -> float:
    """Ring all-reduce: ``2(n-1) alpha + 2(n-1)/n * size_bytes / bandwidth`` (``per_call``: one alpha)."""
    return collective_time_s("all_reduce", size_bytes, world_size, link, latency_charge)


def point_to_point_s(size_bytes: float, link: Link) -> float:
    """One message from one rank to another: ``alpha + size_bytes / bandwidth``."""
    return collective_time_s("point_to_point", size_bytes, 2, link)


def bus_bandwidth(op: str, size_bytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth: the algorithm bandwidth (``size_bytes / seconds``) times ``op``'s bandwidth
    factor, so that one figure can be set against the link's own rate whatever the collective and ranks."""
    _, factor = cost_terms(op, world_size)
    return positive_number(size_bytes, "size_bytes") / positive_number(seconds, "seconds") * factor


def crossover_bytes(link: Link, op: str = "point_to_point", world_size: int = 2,
                    latency_charge: str = "per_step") -> float:
    """The message size where the bandwidth part of ``op``'s time equals the latency part: smaller
    messages are latency-bound, larger ones bandwidth-bound. Point-to-point: ``alpha * bandwidth``."""
    steps, factor = cost_terms(op, world_size, latency_charge)
    if factor == 0:
        raise ValueError(f"{op} on world_size = {world_size} rank moves nothing, so it has no crossover")
    return steps * link.latency_s * link.one_way_bytes_per_s / factor


# -- measured points, and the latency and bandwidth that explain them ---------------------------------------
SWEEP_OPS = ("all_reduce", "all_to_all", "point_to_point")
DEFAULT_SIZES_BYTES = tuple(4 * 4 ** k for k in range(2, 12))  # 64 B .. 16 MiB of float32, x4 apart
DEFAULT_ROUNDS = 5  # the fastest round is kept
DEFAULT_CALLS = 2  # calls back to back per round


@dataclass(frozen=True)
class Sample:
    """One measured point: ``op`` on ``n_ranks`` ranks moved ``size_bytes`` (``comm.py``'s counting) in
    ``seconds`` (for a collective the slowest rank's time; for point-to-point one way, half a round trip),
    per call, in the fastest round."""

    op: str
    n_ranks: int
    size_bytes: int
    seconds: float


@dataclass(frozen=True)
class LinkFit:
    """Latency and bandwidth fitted to some samples, and how well they explain them."""

    latency_s: float
    bandwidth_bytes_per_s: float
    r_squared: float  # 1 - residual / total sum of squares, of log(time)
    median_relative_error: float  # median of |predicted - measured| / measured
    n_samples: int
    latency_clamped: bool = False  # the unconstrained fit gave a negative latency; refitted with zero

    def link(self, name: str = "this machine", source: str = "") -> Link:
        return Link(name, self.bandwidth_bytes_per_s, self.latency_s, "per direction",
                    source or f"fitted by least squares to {self.n_samples} timings, R^2 = {self.r_squared:.3f}",
                    "the same fit")


@dataclass(frozen=True)
class Calibration:
    """What ``run_calibration`` measured and fitted: the samples, one fit over all of them (``link``), one fit
    per operation (how far a single pair of numbers is from each), and the wall time it took."""

    samples: tuple[Sample, ...]
    overall: LinkFit
    per_op: dict[str, LinkFit] = field(default_factory=dict)
    wall_s: float = 0.0
    latency_charge: str = "per_step"
    backend: str = "gloo"

    @property
    def link(self) -> Link:
        n = self.samples[0].n_ranks
        return self.overall.link(f"this machine ({self.backend}, {n} ranks)")

    def op_link(self, op: str) -> Link:
        """The link fitted to ``op``'s points alone: the one to predict that operation with (gloo's
        all-reduce also adds what it receives, so per byte it is slower than a plain send)."""
        if op not in self.per_op:
            raise ValueError(f"this calibration fitted {', '.join(self.per_op)}; got {op!r}")
        n = self.samples[0].n_ranks
        return self.per_op[op].link(f"this machine ({self.backend}, {n} ranks, {op.replace('_', '-')})")


def check_sizes(sizes_bytes, n_ranks: int) -> list[int]:
    """The sweep's message sizes, each a whole number of float32 values that all-to-all can cut evenly."""
    sizes = list(sizes_bytes)
    if not sizes:
        raise ValueError("the sweep needs at least one message size")
    for s in sizes:
        whole_number(s, "a message size (bytes)")
        if s % (4 * n_ranks):
            raise ValueError(f"a message of {s} bytes cannot be cut into {n_ranks} equal float32 pieces for "
                             f"all-to-all: use multiples of 4 x {n_ranks} = {4 * n_ranks} bytes")
    return sizes


ROUND_STATISTICS = {"fastest": min, "median": lambda rounds: float(np.median(rounds))}


def slowest_samples(per_rank: list, n_ranks: int, statistic: str = "fastest") -> list[Sample]:
    """One ``Sample`` per (op, size) of a sweep: the slowest rank in each round, then the ``statistic`` round,
    ``"fastest"`` (the floor: what the link costs when nothing else gets in the way) or ``"median"`` (the
    typical call). Ranks that report ``None`` (outside the group, or not in the ping-pong) are left out."""
    ranks = [r for r in per_rank if r is not None]
    out = []
    for op, size in ranks[0]:
        runs = [r[op, size] for r in ranks if r[op, size] is not None]
        out.append(Sample(op, n_ranks, size, ROUND_STATISTICS[statistic]([max(times) for times in zip(*runs)])))
    return out


def r_squared(measured: np.ndarray, predicted: np.ndarray) -> float:
    """``1 - sum (m - p)^2 / sum (m - mean m)^2``: the share of the variation of ``measured`` that
    ``predicted`` explains (1 is perfect, 0 is no better than the mean, below 0 worse)."""
    measured, predicted = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    total = float(((measured - measured.mean()) ** 2).sum())
    residual = float(((measured - predicted) ** 2).sum())
    return 1.0 - residual / total if total > 0 else (1.0 if residual == 0 else 0.0)


def fit_link(samples, latency_charge: str = "per_step") -> LinkFit:
    """Least-squares ``alpha`` and bandwidth so that ``steps * alpha + factor * S / bandwidth`` (the
    ``alpha_beta`` formula of each sample's operation) matches the measured seconds, in relative terms.

    Needs at least two samples of different sizes. A negative latency (possible when every message is
    large) is refitted as zero; times that do not grow with size have no bandwidth and are refused.
    """
    samples = list(samples)
    if len({s.size_bytes for s in samples}) < 2:
        raise ValueError(f"a fit needs samples of at least 2 different sizes, got {len(samples)} sample(s) of "
                         f"sizes {sorted({s.size_bytes for s in samples})}")
    for s in samples:
        if not s.seconds > 0:
            raise ValueError(f"measured times must be positive: {s}")
    terms = [cost_terms(s.op, s.n_ranks, latency_charge) for s in samples]
    a = np.array([[steps, factor * s.size_bytes] for (steps, factor), s in zip(terms, samples)], dtype=float)
    t = np.array([s.seconds for s in samples], dtype=float)
    weighted = a / t[:, None]  # each equation in units of its own time: relative errors
    (alpha, inv_bw), *_ = np.linalg.lstsq(weighted, np.ones_like(t), rcond=None)
    clamped = alpha < 0
    if clamped:
        col = weighted[:, 1]
        alpha, inv_bw = 0.0, float(col.sum() / (col ** 2).sum())
    if not inv_bw > 0:
        raise ValueError("the measured times do not grow with message size, so no bandwidth can be fitted "
                         f"(fitted seconds per byte {inv_bw:.3g}); sweep over a wider range of sizes")
    predicted = a @ np.array([alpha, inv_bw])
    return LinkFit(float(alpha), float(1.0 / inv_bw), r_squared(np.log(t), np.log(predicted)),
                   float(np.median(np.abs(predicted - t) / t)), len(samples), bool(clamped))
