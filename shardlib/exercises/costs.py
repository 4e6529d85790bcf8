"""Grader for the communication-costs exercise: fit a latency and a bandwidth to a sweep of timings.

The learner writes ``fit_alpha_beta(sizes_bytes, times_s) -> (latency_s, bandwidth_bytes_per_s)``: the
alpha-beta model (Hockney 1994), ``t = alpha + S / bandwidth``, a straight line in ``S``. The reference,
``predict.alpha_beta.fit_link``, divides each equation by its own measured time (relative errors): otherwise
the largest messages decide everything and the latency is left to their noise (or comes out negative).
The starter does not say so: a first, unweighted fit passes the exact sweeps, fails the noisy ones, and
the grader shows why in numbers (the line's smallest and largest message against their times); the
notebook's folded hint leads to the weighting.

The synthetic sweeps have a known latency and bandwidth: exact ones at three scales and noisy ones (10 %
log-normal, seeded), some unsorted. Given a ``Ranks`` pool, the grader then times a point-to-point sweep
on ranks 0 and 1 and sets the learner's fit beside the library's fit of the same points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlib.core.checks import is_number
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.predict.alpha_beta import DEFAULT_SIZES_BYTES, Sample, fit_link
from shardlib.runtime.errors import PoolClosedError, RankError, RankTimeoutError

LATENCY_RTOL, BANDWIDTH_RTOL = 0.25, 0.15  # against the truth; the reference is within 7 % on every case
LIVE_RTOL, LIVE_LATENCY_ATOL_S = 0.2, 5e-6  # against the library's fit of the same live points


@dataclass(frozen=True)
class Sweep:
    """A synthetic sweep: ``sizes_bytes`` timed as ``latency_s + S / bandwidth``, times ``exp(noise)``
    with ``noise`` drawn from N(0, ``noise``) by ``seed``, handed over in ``order`` (indices)."""

    name: str
    latency_s: float
    bandwidth_bytes_per_s: float
    sizes_bytes: tuple[int, ...]
    noise: float = 0.0
    seed: int = 0
    shuffled: bool = False

    def data(self) -> tuple[list[int], list[float]]:
        sizes = np.array(self.sizes_bytes, dtype=float)
        times = self.latency_s + sizes / self.bandwidth_bytes_per_s
        rng = np.random.default_rng(self.seed)
        if self.noise:
            times = times * np.exp(rng.normal(0.0, self.noise, len(sizes)))
        order = rng.permutation(len(sizes)) if self.shuffled else np.arange(len(sizes))
        return [int(self.sizes_bytes[i]) for i in order], [float(times[i]) for i in order]


def _sizes(first: int, last: int, step: int) -> tuple[int, ...]:
    """``first, first x step, ...`` up to ``last``."""
    return tuple(first * step ** i for i in range(round(math.log(last / first, step)) + 1))


SWEEPS = (
    Sweep("this machine's scale (100 us, 2 GB/s), exact", 100e-6, 2e9, _sizes(64, 16 * 2 ** 20, 4)),
    Sweep("an NVLink node's scale (5 us, 450 GB/s), exact, unsorted", 5e-6, 450e9, _sizes(1024, 2 ** 30, 4),
          shuffled=True, seed=1),
    Sweep("large messages only (20 us, 50 GB/s, 1 MiB and up), exact", 20e-6, 50e9, _sizes(2 ** 20, 2 ** 28, 2)),
    Sweep("this machine's scale with 10 % noise, unsorted", 100e-6, 2e9, _sizes(64, 16 * 2 ** 20, 4), 0.10, 3,
          shuffled=True),
    Sweep("a network's scale (50 us, 12.5 GB/s) with 10 % noise", 50e-6, 12.5e9, _sizes(256, 2 ** 28, 4), 0.10, 3),
)


def _plain_least_squares(sizes, times) -> tuple[float, float]:
    """The fit without weights: absolute errors, so the largest messages decide."""
    slope, intercept = np.polyfit(np.asarray(sizes, dtype=float), np.asarray(times, dtype=float), 1)
    return float(intercept), float(1.0 / slope) if slope else math.inf


def _through_origin(sizes, times) -> float:
    """The bandwidth of ``t = S / bandwidth`` with no intercept, by least squares."""
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    return float((s * s).sum() / (s * t).sum())


def _close(a: float, b: float, rtol: float = 0.02) -> bool:
    return math.isclose(a, b, rel_tol=rtol)


_WHY_PLAIN = ("Plain least squares adds up squared errors in seconds, so the slowest messages count the most: a "
              "10 % error on a message of milliseconds is worth more than the whole latency of tens of "
              "microseconds, and the line bends to the big messages. Check how much each point counts in your "
              "fit, then open the hint under the exercise")


def _misfit(sizes, times, latency: float, bandwidth: float) -> str:
    """What the learner's line says for the smallest and the largest message, against what they took."""
    out = []
    for pick, name in ((np.argmin, "smallest"), (np.argmax, "largest")):
        i = int(pick(sizes))
        line = latency + sizes[i] / bandwidth if bandwidth else math.inf
        out.append(f"the {name} message ({sizes[i]:,} bytes) {_duration(line)} where it took {_duration(times[i])}"
                   f" ({abs(line - times[i]) / times[i]:.0%} off)")
    return f"Your line gives {out[0]}, and {out[1]}."


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "forever"
    return f"{seconds * 1e3:,.3g} ms" if abs(seconds) >= 1e-3 else f"{seconds * 1e6:,.3g} us"


def _hint(sweep: Sweep, sizes, times, latency: float, bandwidth: float) -> str:
    """The likely mistake behind a wrong ``(latency, bandwidth)`` on ``sweep``."""
    alpha, beta = sweep.latency_s, sweep.bandwidth_bytes_per_s
    smallest = times[int(np.argmin(sizes))]
    units = [((beta, alpha), "the two numbers are swapped: return (latency_s, bandwidth_bytes_per_s), in that order"),
             ((None, 1 / beta), "the bandwidth is the slope, seconds per byte: the line's slope is 1 / bandwidth, "
                                "so return 1 / slope"),
             *(((alpha * f, None), f"the latency is in {unit}: every time here is in seconds, and so must the "
                                   "answer be") for f, unit in ((1e3, "milliseconds"), (1e6, "microseconds"))),
             *(((None, beta / f), f"the bandwidth is in {unit}: return bytes per second")
               for f, unit in ((1e3, "bytes per millisecond"), (1e6, "MB/s"), (1e9, "GB/s")))]
    hint = grading.first_match((latency, bandwidth), units, lambda mine, want: all(
        w is None or _close(m, w, 0.25) for m, w in zip(mine, want)))
    if hint:
        return hint
    if latency < 0:
        return ("the latency came out negative, which no link has. " + _misfit(sizes, times, latency, bandwidth)
                + " Your line follows the largest messages and leaves the small ones to chance. " + _WHY_PLAIN)
    plain_latency, _ = _plain_least_squares(sizes, times)
    if latency == 0 and (_close(bandwidth, _through_origin(sizes, times))
                         or _close(bandwidth, max(sizes) / times[int(np.argmax(sizes))])):
        if plain_latency < 0:  # here plain least squares, clamped at zero, and a line through zero look alike
            return ("a latency of exactly 0: that is plain least squares clamped at zero (or a line forced "
                    "through zero). " + _misfit(sizes, times, latency, bandwidth) + " " + _WHY_PLAIN)
        return ("the fit has no intercept: t = alpha + size / bandwidth has a fixed part, and a line forced "
                "through zero (or the largest message's size / time) folds it into the bandwidth")
    if _close(latency, plain_latency, 0.05) or (latency == 0 and plain_latency < 0):
        return ("that is plain least squares. " + _misfit(sizes, times, latency, bandwidth) + " " + _WHY_PLAIN)
    if _close(latency, times[0], 0.02) and sizes[0] != min(sizes):
        return ("the latency is the time of the first point handed over, and this sweep is not sorted: it is "
                "not the smallest message. Fit the line through every point, in any order")
    if _close(latency, smallest, 0.02) and not _close(smallest, alpha, 0.25):
        return (f"the latency is the time of the smallest message ({smallest * 1e6:,.1f} us): that message "
                f"still spends size / bandwidth on its bytes. The latency is the intercept of the line through "
                f"every point")
    return (_misfit(sizes, times, latency, bandwidth) + " Check that you fit one straight line through every "
            "point, t = alpha + size / bandwidth, that the intercept is the latency and the slope 1 / bandwidth, "
            "and that the answer is (latency_s, bandwidth_bytes_per_s) in seconds and bytes per second")


def _two_numbers(got: Collector, where: str, answer, check: str | None = None) -> tuple[float, float] | None:
    """The answer as ``(latency_s, bandwidth_bytes_per_s)``, or ``None`` after saying it is not two numbers
    (against the property ``check``)."""
    if isinstance(answer, (tuple, list)) and len(answer) == 2 and all(is_number(x) and math.isfinite(x)
                                                                      for x in answer):
        return float(answer[0]), float(answer[1])
    got.fail(f"{where}: return two finite numbers (latency_s, bandwidth_bytes_per_s), got {answer!r}", check)
    return None


def _check_sweep(got: Collector, sweep: Sweep, sizes, times, answer) -> None:
    pair = _two_numbers(got, sweep.name, answer)
    if pair is None:
        return
    latency, bandwidth = pair
    good = (math.isclose(latency, sweep.latency_s, rel_tol=LATENCY_RTOL)
            and math.isclose(bandwidth, sweep.bandwidth_bytes_per_s, rel_tol=BANDWIDTH_RTOL))
    if good:
        return
    got.fail(f"{sweep.name}: you returned latency {latency * 1e6:,.4g} us and bandwidth {bandwidth / 1e9:,.4g} GB/s; "
             f"the sweep was made with {sweep.latency_s * 1e6:g} us and {sweep.bandwidth_bytes_per_s / 1e9:g} GB/s: "
             f"{_hint(sweep, sizes, times, latency, bandwidth)}")


def _live(got: Collector, fit_fn, ranks, check: str | None = None) -> str:
    """Time point-to-point messages on ranks 0 and 1 and compare the learner's fit with the library's; what
    differs breaks the property ``check``."""
    from shardlib.lab.costs.calibration import run_calibration

    try:
        cal = run_calibration(ranks, DEFAULT_SIZES_BYTES, rounds=5, calls=2, n_ranks=2, statistic="median",
                              ops=("point_to_point",))
    except (RankError, RankTimeoutError, PoolClosedError) as exc:
        got.fail(f"the live sweep could not run on these ranks ({type(exc).__name__}: {exc}); start a fresh pool "
                 f"with Ranks(2) and grade again", check)
        return ""
    samples: list[Sample] = sorted(cal.samples, key=lambda s: s.size_bytes)
    sizes, times = [s.size_bytes for s in samples], [s.seconds for s in samples]
    answer = grading.call(got, "this machine's sweep", fit_fn, list(sizes), list(times), check=check)
    pair = None if answer is None else _two_numbers(got, "this machine's sweep", answer, check)
    if pair is None:
        return ""
    latency, bandwidth, ref = *pair, fit_link(samples)
    line = (f"this machine (point-to-point, ranks 0 and 1, median of 5 rounds): yours {latency * 1e6:,.1f} us and "
            f"{bandwidth / 1e9:,.3f} GB/s, the library's {ref.latency_s * 1e6:,.1f} us and "
            f"{ref.bandwidth_bytes_per_s / 1e9:,.3f} GB/s")
    same_latency = (math.isclose(latency, ref.latency_s, rel_tol=LIVE_RTOL)
                    or abs(latency - ref.latency_s) <= LIVE_LATENCY_ATOL_S)
    if not (same_latency and math.isclose(bandwidth, ref.bandwidth_bytes_per_s, rel_tol=LIVE_RTOL)):
        got.fail(f"{line}: the same points should give the same line within {LIVE_RTOL:.0%}. A real sweep is "
                 f"noisier than the synthetic ones: check that each point counts by its relative error and that a "
                 f"negative latency is clamped at zero, as in the hint", check)
    return line


@grading.checks(synthetic=2, live=1)
def grade_fit_alpha_beta(fit_fn, ranks=None) -> ExerciseResult:
    """Grade a learner's ``fit_alpha_beta(sizes_bytes, times_s) -> (latency_s, bandwidth_bytes_per_s)`` on
    synthetic sweeps of known latency and bandwidth (exact and noisy, three scales, some unsorted), then,
    given ``ranks`` (a ``Ranks`` pool of at least 2), on a live point-to-point sweep against the library's
    own fit. It never raises for a wrong answer; an unwritten function is "not written yet". Without ``ranks``
    it checks ``synthetic`` alone (``holds("live")`` then raises)."""
    check_callable(fit_fn, "fit_alpha_beta")
    checked = (f"{len(SWEEPS)} synthetic sweeps (latency within {LATENCY_RTOL:.0%}, bandwidth within "
               f"{BANDWIDTH_RTOL:.0%} of the truth)" + (", then this machine's ranks" if ranks is not None else ""))
    got = Collector("fit latency and bandwidth", checked,
                    [c for c in grade_fit_alpha_beta.checks if ranks is not None or c != "live"])
    for sweep in SWEEPS:
        sizes, times = sweep.data()
        answer = grading.call(got, sweep.name, fit_fn, list(sizes), list(times))
        if answer is not None:
            _check_sweep(got, sweep, sizes, times, answer)
    if got.failed:
        return got.result()
    if ranks is None:
        return got.result(f"right on all {len(SWEEPS)} synthetic sweeps; pass ranks=... to fit this machine too")
    line = _live(got, fit_fn, ranks, "live")
    return got.result(f"right on all {len(SWEEPS)} synthetic sweeps; {line}")
