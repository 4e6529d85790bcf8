"""A measured claim's one line: the ratio, the band, the retry, and a failure under a test run."""

import pytest

from shardlib.runtime.verdict import Verdict, verified


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


def test_a_claim_that_never_holds_fails_under_a_test_run_with_its_numbers():
    with pytest.raises(AssertionError, match="step: predicted 1 s, measured 5 s, ratio 5.00"):
        verified(lambda: 5.0, lambda m: [Verdict("step", 1.0, m)])


def test_a_learner_reads_the_numbers_not_a_traceback(monkeypatch, capsys):
    monkeypatch.setattr("shardlib.runtime.verdict.strict_checks", lambda: False)
    _, (v,) = verified(lambda: 5.0, lambda m: [Verdict("step", 1.0, m)], attempts=2)
    assert not v.held and v.attempts == 2 and "run the cell again" in capsys.readouterr().out


@pytest.mark.parametrize("kwargs, message", [
    (dict(predicted=0.0), "must be positive"), (dict(low=1.2), "must contain 1"), (dict(attempts=0), "at least 1"),
])
def test_bad_verdicts_say_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Verdict("x", **{"predicted": 1.0, "measured": 1.0, **kwargs})
