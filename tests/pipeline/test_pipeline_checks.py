"""The claims notebook 03 prints, as library functions: what each measures, what it predicts, and its
verdicts' names and bands. The clock is not asserted here (the notebook's run asserts it, under nbval, and
the benchmarks measure it): ``verified`` is replaced by one measurement whose verdicts are returned as
found, so only what does not depend on the clock is checked."""

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.core.toy import activations, stack_weights
from shardlib.lab.pipeline import bubble
from shardlib.lab.pipeline.bubble import run_bubble_check, run_pace_check, run_trip_check, run_uneven_check
from shardlib.predict.pipeline import pipeline_bubble_fraction

SHAPE = ModelConfig("pipeline check test", n_layers=8, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64,
                    bytes_per_param=4.0)


@pytest.fixture(scope="module")
def model():
    return {"layers": stack_weights(SHAPE, seed=0, parts=("mlp",)), "x": activations(16, 4, 32, seed=1),
            "grad": activations(16, 4, 32, seed=2)}


@pytest.fixture
def once(monkeypatch):
    """``verified`` measuring once and never judging: the verdicts come back as found."""
    def measure_once(measure, verdicts, attempts=3):
        result = measure()
        return result, tuple(verdicts(result))
    monkeypatch.setattr(bubble, "verified", measure_once)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_bubble_check_predicts_the_formula_on_both_pools(pool2, pool4, model, once, name):
    check = run_bubble_check((pool2, pool4), (1, 4), SHAPE, model["layers"], model["x"], model["grad"], op_s=0.002,
                             name=name)
    assert list(check.attempts) == [(p, m) for p in (2, 4) for m in (1, 4)] and check.op_s == 0.002
    assert all(len(found) == 1 for found in check.attempts.values())  # measured once, as ``once`` asks
    assert [(v.predicted, v.unit) for v in check.verdicts] == [
        (pipeline_bubble_fraction(p, m), "%") for p in (2, 4) for m in (1, 4)]
    assert all((v.low, v.high) == bubble.BUBBLE_BAND for v in check.verdicts)
    assert "p = 4, m = 4" in check.verdicts[-1].line and "predicted 42.9%" in check.verdicts[-1].line
    measured = check.measured()
    assert set(measured) == {2, 4} and set(measured[4]) == {1, 4}
    assert all(0 <= f < 1 for per_p in measured.values() for f in per_p.values())


def test_bubble_check_without_a_gradient_times_forward_only_passes(pool2, model, once):
    check = run_bubble_check(pool2, (1, 4), SHAPE, model["layers"], model["x"], None, op_s=0.002)
    assert [(v.predicted, v.unit) for v in check.verdicts] == [(pipeline_bubble_fraction(2, m), "%") for m in (1, 4)]
    assert all(0 <= f < 1 for f in check.measured()[2].values())


def test_pace_check_predicts_the_slow_stage_from_the_schedule(pool4, model, once):
    check = run_pace_check(pool4, SHAPE, model["layers"], model["x"], n_microbatches=6, op_s=0.002, rounds=1)
    assert list(check.forward_s) == ["uniform", "stage 1 slow"]
    assert check.forward_s["stage 1 slow"] == (0.002, 0.004, 0.002, 0.002)
    assert check.predicted_s("uniform") == pytest.approx(9 * 0.002)  # (m + p - 1) stage-times
    assert check.predicted_s("stage 1 slow") == pytest.approx(5 * 0.002 + 5 * 0.004)  # sum(t) + (m - 1) max(t)
    assert check.predicted_shares("stage 1 slow")[1] == pytest.approx(6 * 0.004 / 0.03)
    assert [v.what for v in check.verdicts] == ["step, uniform", "step, stage 1 slow", "slow step / uniform step",
                                                "stage 1's share of the slow step"]
    assert len(check.busy_shares("stage 1 slow")) == 4
    with pytest.raises(ValueError, match="slow_stage is a stage of the pool's 4"):
        run_pace_check(pool4, SHAPE, model["layers"], model["x"], slow_stage=4)


def test_uneven_check_is_exact_and_predicts_each_cut(pool4, model, once):
    counts = {"even": (2, 2, 1, 1), "lighter ends": stage_layer_counts(6, 4, end_layers=1)}
    check = run_uneven_check(pool4, SHAPE, model["layers"][:6], model["x"], model["grad"], counts, layer_s=0.001,
                             rounds=1)
    assert check.exact.against_reference().bit_for_bit
    assert [len(h) for h in check.exact.layers_held] == [1, 2, 2, 1]
    assert check.work == {"even": (3, 2, 1, 2), "lighter ends": (2, 2, 2, 2)}
    assert check.predicted_s("even") / check.predicted_s("lighter ends") == pytest.approx(23 / 18)
    assert [v.what for v in check.verdicts] == ["step, even", "step, lighter ends", "even / lighter ends"]


def test_uneven_check_without_a_gradient_is_exact_forward_only(pool4, model, once):
    counts = {"even": (2, 2, 1, 1), "lighter ends": stage_layer_counts(6, 4, end_layers=1)}
    check = run_uneven_check(pool4, SHAPE, model["layers"][:6], model["x"], None, counts, layer_s=0.001, rounds=1)
    assert not check.exact.schedule.training and check.exact.against_reference().bit_for_bit
    assert [len(h) for h in check.exact.layers_held] == [1, 2, 2, 1]


def test_trip_check_predicts_p_stage_times_and_one_departure_each(pool4, model, once):
    check = run_trip_check(pool4, SHAPE, model["layers"], model["x"], op_s=0.002, rounds=1)
    assert len(check.trips.trip_s) == 4 and len(check.trips.gap_s) == 3
    assert [v.predicted for v in check.verdicts] == [pytest.approx(0.008), pytest.approx(0.002)]
