"""A claim a busy machine could not show: explained to a learner, fatal under CI."""

import pytest

from shardlib.ui.claims import claim, strict


def test_a_claim_that_held_says_nothing(capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SHARDLIB_STRICT_CLAIMS", raising=False)
    assert claim(True, "unused") is True
    assert capsys.readouterr().out == ""


def test_a_learner_reads_the_numbers(capsys, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "0")
    assert not strict()
    assert claim(False, "measured 2.4x the prediction", attempts=3) is False
    out = capsys.readouterr().out
    assert "Not shown after 3 attempts: measured 2.4x the prediction" in out and "Traceback" not in out


@pytest.mark.parametrize("variable", ["CI", "SHARDLIB_STRICT_CLAIMS"])
def test_ci_fails(monkeypatch, variable):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SHARDLIB_STRICT_CLAIMS", raising=False)
    monkeypatch.setenv(variable, "true")
    assert strict()
    with pytest.raises(AssertionError, match="did not hold after 2 attempts: 2.4x"):
        claim(False, "2.4x", attempts=2)
