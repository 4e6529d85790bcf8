"""A measured claim's one line: the ratio, the band, the retry, and a failure under a test run."""

import pytest

from shardlib.lab.verdict import Verdict, refitted, strict_checks, verified


def test_a_verdict_prints_prediction_measurement_ratio_and_whether_it_held():
    v = Verdict("the bubble at m = 4", predicted=0.02, measured=0.025)
    assert v.ratio == pytest.approx(1.25) and v.held
    assert v.line == "the bubble at m = 4: predicted 20 ms, measured 25 ms, ratio 1.25: as predicted"
    share = Verdict("the bubble's share", 0.43, 0.45, unit="%", low=0.9, high=1.1)
    assert share.line == "the bubble's share: predicted 43.0%, measured 45.0%, ratio 1.05: as predicted"
    assert not Verdict("x", 1.0, 2.5).held and "not shown this time" in Verdict("x", 1.0, 2.5).line
    assert "within 0.9-1.1" in share.how_measured


def test_verified_measures_again_until_it_holds_and_says_which_attempt_it_kept():
    runs = iter([3.0, 1.1, 5.0])
    result, (v,) = verified(lambda: next(runs), lambda m: [Verdict("step", 1.0, m)])
    assert result == 1.1 and v.attempts == 2 and v.held


def test_a_fit_with_nothing_to_fit_is_measured_again_and_the_last_error_raised():
    tried = []

    def fit(attempt: int) -> int:
        tried.append(attempt)
        if attempt < 3:
            raise ValueError(f"no bandwidth to fit at attempt {attempt}")
        return 10 * attempt

    assert refitted(fit) == 30 and tried == [1, 2, 3]
    tried.clear()
    with pytest.raises(ValueError, match="no bandwidth to fit at attempt 2"):
        refitted(fit, attempts=2)
    assert tried == [1, 2]
    with pytest.raises(ValueError, match="attempts must be at least 1, got 0"):
        refitted(fit, attempts=0)


def test_a_claim_that_never_holds_fails_when_strict_with_its_numbers(monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")
    with pytest.raises(AssertionError, match="step: predicted 1 s, measured 5 s, ratio 5.00"):
        verified(lambda: 5.0, lambda m: [Verdict("step", 1.0, m)])


def test_a_learner_reads_the_numbers_not_a_traceback(monkeypatch, capsys):
    monkeypatch.delenv("SHARDLIB_STRICT_CLAIMS", raising=False)
    _, (v,) = verified(lambda: 5.0, lambda m: [Verdict("step", 1.0, m)], attempts=2)
    assert not v.held and v.attempts == 2 and "run the cell again" in capsys.readouterr().out


def test_only_shardlib_strict_claims_makes_a_claim_fail(monkeypatch):
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")  # the notebooks' conftest under nbval, make busy-check
    assert strict_checks()
    for unstrict in ("0", ""):  # the browser test's kernels; a learner's
        monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", unstrict)
        monkeypatch.setenv("CI", "1")  # the surroundings change nothing
        assert not strict_checks()


@pytest.mark.parametrize("kwargs, message", [
    (dict(predicted=0.0), "must be positive"), (dict(low=1.2), "must contain 1"), (dict(attempts=0), "at least 1"),
])
def test_bad_verdicts_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Verdict("x", **{"predicted": 1.0, "measured": 1.0, **kwargs})


def test_a_one_sided_verdict_says_what_was_claimed_not_as_predicted():
    # the fit predicts 80x growth, the run shows 20x: far from the prediction, yet the claim (at least 2x) holds
    v = Verdict.one_sided("16 MiB over 64 B", predicted=80.0, measured=20.0, unit="x", at_least=2.0)
    assert v.held and v.ratio == pytest.approx(0.25) and not v.banded
    assert v.line == "16 MiB over 64 B: predicted 80x, measured 20x; claimed at least 2x: holds"
    assert "as predicted" not in v.line and "ratio" not in v.line
    assert v.how_measured == "16 MiB over 64 B: passes when measured is at least 2x; attempt 1 of at most 3 kept"
    flat = Verdict.one_sided("16 MiB over 64 B", 80.0, 1.5, "x", at_least=2.0)
    assert not flat.held and flat.line.endswith("claimed at least 2x: not shown this time")
    # an upper bound with a band beside it: both must hold, and the line shows the ratio the band judges
    faster = Verdict.one_sided("tp = 2 over a replica", 0.55, 0.6, "x", at_most=1.0, within=2.0)
    assert faster.held and (faster.low, faster.high) == (0.5, 2.0)
    assert faster.line == "tp = 2 over a replica: predicted 0.55x, measured 0.6x, ratio 1.09; claimed at most 1x: holds"
    assert not Verdict.one_sided("x", 0.55, 1.1, "x", at_most=1.0, within=2.0).held  # under 2x, over the bound
    assert not Verdict.one_sided("x", 0.55, 0.2, "x", at_most=1.0, within=2.0).held  # under the bound, out of band


def test_verified_keeps_a_one_sided_claim_when_it_measures_again():
    runs = iter([1.5, 3.0])
    _, (v,) = verified(lambda: next(runs), lambda m: [Verdict.one_sided("growth", 80.0, m, "x", at_least=2.0)])
    assert v.attempts == 2 and v.at_least == 2.0 and v.held


@pytest.mark.parametrize("kwargs, message", [
    (dict(), "needs at_least or at_most"), (dict(at_least=3.0, at_most=2.0), "leave nothing"),
    (dict(at_least=float("inf")), "finite number"), (dict(at_most=1.0, within=0.5), "within must be at least 1"),
])
def test_bad_one_sided_verdicts_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Verdict.one_sided("x", 1.0, 1.0, "x", **kwargs)
