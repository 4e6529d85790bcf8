"""A timing claim in a test goes the way the notebooks' claims go: measured again while a busy machine
spoils it (``costs.drivers.measure_until``), then claimed (``runtime.measure.timing_claim``), which under a
test run raises with the numbers of the last attempt. No bare wall-clock comparison in a unit test: what
does not depend on the clock (bytes, order, exactness, which rank was delayed) is asserted plainly."""

from __future__ import annotations

from shardlib.costs.drivers import measure_until
from shardlib.runtime.measure import timing_claim


def claim_timing(measure, holds, claim: str, numbers, attempts: int = 3):
    """``measure()`` up to ``attempts`` times until ``holds(result)``; then ``timing_claim`` with
    ``numbers(result)``, an ``AssertionError`` under pytest if it never held. Returns the last result."""
    result, attempt = measure_until(measure, holds, attempts)
    timing_claim(holds(result), claim, numbers(result), attempt)
    return result
