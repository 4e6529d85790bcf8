"""Two microbatches through the MoE layer, in turn and overlapped (DualPipe's point). The outputs, the
verdicts' names and bands and the formula (priced from the bytes logged) are checked plainly; the exposed
time measured is the notebook's claim under nbval and the benchmark's (``verified`` is replaced by one
measurement whose verdicts come back as found)."""

import math

import pytest

from shardlib.lab.experts import overlap_drivers
from shardlib.lab.experts.overlap_drivers import EXPOSED_BAND, run_expert_overlap_check
from shardlib.predict.experts import predicted_exposed_s


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


def test_overlap_keeps_the_outputs_and_is_predicted_to_hide_half_the_rows(pool, once):
    check = run_expert_overlap_check(pool, repeats=2)
    assert check.exact  # both orders give the one-process layer's outputs bit for bit
    assert [v.what for v in check.verdicts] == ["exposed all-to-all time, two microbatches in turn",
                                                "exposed all-to-all time, overlapped"]
    assert all((v.low, v.high) == EXPOSED_BAND for v in check.verdicts)
    before, after = check.verdicts
    assert all(math.isfinite(t) and t >= 0 for t in (before.measured, after.measured))
    # the prediction prices the bytes each rank logged: no clock in it
    assert after.predicted < 0.6 * before.predicted


def test_bad_overlap_input_says_what_is_wrong(pool2):
    with pytest.raises(ValueError, match="cannot make two microbatches"):
        run_expert_overlap_check(pool2, n_tokens=3)
    with pytest.raises(ValueError, match="expert_s"):
        run_expert_overlap_check(pool2, expert_s=0)
