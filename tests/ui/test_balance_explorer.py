"""The balancing figure and the bias-rate explorer: the figure draws one line per method, and each end of
the rate slider redraws the explorer with that rate's replay (too small a rate leaves the load uneven)."""

import pytest

from shardlib.lab.experts.training import BALANCE_CONFIG, make_moe_problem, train_toy
from shardlib.ui.experts_figures import balance_steps_figure
from shardlib.ui.experts_widgets import BIAS_RATES, bias_rate_explorer


def test_balance_figure_draws_one_line_per_method():
    fig = balance_steps_figure({"none": [3.0, 2.5], "aux-free": [3.0, 1.2]})
    assert [t.name for t in fig.data] == ["none", "aux-free"]
    assert list(fig.data[1].y) == [3.0, 1.2] and list(fig.data[1].x) == [1, 2]
    with pytest.raises(ValueError, match="at least one series"):
        balance_steps_figure({})


def test_each_end_of_the_rate_slider_redraws_that_rates_replay():
    steps = 6
    box = bias_rate_explorer(BALANCE_CONFIG, steps=steps, baseline={"none": [3.0] * steps})
    slider, text, fig = box.children[:3]
    seen = []
    for rate in (BIAS_RATES[0], BIAS_RATES[-1]):
        slider.value = rate
        cfg = BALANCE_CONFIG.but(balance="aux-free", bias_rate=rate)
        problem = make_moe_problem(cfg, 128, skew=1.0)
        run = train_toy(None, problem.x, problem.target, problem.weights, cfg, steps=steps, n_groups=2)
        want = [float(c.max() / c.double().mean()) for c in run.counts]
        assert list(fig.figure.data[-1].y) == pytest.approx(want)
        assert fig.figure.data[-1].name == f"aux-free, rate {rate:g}" and f"rate {rate:g}:" in text.value
        seen.append(tuple(fig.figure.data[-1].y))
    assert seen[0] != seen[1]
    assert list(fig.figure.data[0].y) == [3.0] * steps  # the baseline stays
