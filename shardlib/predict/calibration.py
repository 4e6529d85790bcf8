"""Calibrate the alpha-beta model: a latency and a bandwidth fitted to measured times by least squares.

``ranks.sweep_on_rank`` times each operation over message sizes; ``drivers.run_calibration`` runs it on
a pool. Here (pure: numbers in, numbers out) each (operation, size) keeps the slowest rank's time (a
collective ends for everybody when the last rank is done) in the fastest or the median round, and
``fit_link`` solves ``t = steps * alpha + factor * S / B`` (``alpha_beta.cost_terms``), linear in
``alpha`` and ``1 / B``, for relative errors, so small messages weigh as much as large ones. Its quality
is R squared of log(time), as on the log-log plot, with the median relative error beside it.
Notebook 02 says why the fastest round is a floor and the median the typical call. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shardlib.core.checks import whole_number
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import cost_terms

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


def _slowest_per_round(per_rank: list) -> dict:
    """``{(op, size): [the slowest rank's seconds in each round]}``; ranks that report ``None`` (outside
    the group, or not in the ping-pong) are left out."""
    ranks = [r for r in per_rank if r is not None]
    out = {}
    for key in ranks[0]:
        runs = [r[key] for r in ranks if r[key] is not None]
        out[key] = [max(times) for times in zip(*runs)]
    return out


def fastest_of_slowest(per_rank: list, n_ranks: int) -> list[Sample]:
    """One ``Sample`` per (op, size) of a sweep: the slowest rank in each round, then the fastest round."""
    return [Sample(op, n_ranks, size, min(rounds)) for (op, size), rounds in _slowest_per_round(per_rank).items()]


def median_of_slowest(per_rank: list, n_ranks: int) -> list[Sample]:
    """One ``Sample`` per (op, size) of a sweep: the slowest rank in each round, then the median round
    (the typical call, where ``fastest_of_slowest`` keeps the floor)."""
    return [Sample(op, n_ranks, size, float(np.median(rounds)))
            for (op, size), rounds in _slowest_per_round(per_rank).items()]


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
