"""Two microbatches through the MoE layer, in turn and overlapped (DualPipe's point). The outputs and the
formula are checked plainly; the exposed time only through ``claim_timing`` (``verified`` replaced by one
measurement, so the claim's retries are the test's)."""

import pytest
from timing_claims import claim_timing

from shardlib.experts import overlap_drivers
from shardlib.experts.overlap_drivers import EXPOSED_BAND, run_overlap_check
from shardlib.experts.predict import predicted_exposed_s


def test_the_exposed_time_formula_by_hand():
    counts, rows = [0.002, 0.002], [0.020, 0.021, 0.022, 0.023]
    assert predicted_exposed_s(counts, rows, 0.030, overlap=False) == pytest.approx(0.004 + 0.086)
    # overlapped: A's dispatch and B's combine exposed, the other two hidden under 30 ms of experts
    assert predicted_exposed_s(counts, rows, 0.030, overlap=True) == pytest.approx(0.004 + 0.020 + 0.023)
    # experts shorter than an all-to-all: what sticks out is exposed
    assert predicted_exposed_s(counts, rows, 0.015, overlap=True) == pytest.approx(0.004 + 0.020 + 0.006 + 0.007
                                                                                    + 0.023)


@pytest.fixture
def once(monkeypatch):
    def measure_once(measure, verdicts, attempts=3):
        result = measure()
        return result, tuple(verdicts(result))
    monkeypatch.setattr(overlap_drivers, "verified", measure_once)


def test_overlap_keeps_the_outputs_and_hides_half_the_rows(pool, once):
    check = claim_timing(lambda: run_overlap_check(pool, repeats=2), lambda c: all(v.held for v in c.verdicts),
                         "the exposed all-to-all time follows the alpha-beta prediction, in turn and overlapped",
                         lambda c: "; ".join(v.line for v in c.verdicts))
    assert check.exact  # both orders give the one-process layer's outputs bit for bit
    assert [v.what for v in check.verdicts] == ["exposed all-to-all time, two microbatches in turn",
                                                "exposed all-to-all time, overlapped"]
    assert all((v.low, v.high) == EXPOSED_BAND for v in check.verdicts)
    assert check.predicted_after_s < 0.6 * check.predicted_before_s


def test_bad_overlap_input_says_what_is_wrong(pool2):
    with pytest.raises(ValueError, match="cannot make two microbatches"):
        run_overlap_check(pool2, n_tokens=3)
    with pytest.raises(ValueError, match="expert_s"):
        run_overlap_check(pool2, expert_s=0)
