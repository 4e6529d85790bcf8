"""Step time per layout: Spearman's correlation, the toy cluster's arithmetic and the planner's terms for
a toy layout by hand, and one run on 4 ranks checked for structure (no timing thresholds here: the
benchmark and the notebook report the errors)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig
from shardlib.facts.hardware import Link, toy_cluster
from shardlib.lab.training.step_time import run_step_time_check
from shardlib.predict.training.time_model import TrainingWorkload, model_flops_per_token, score_training
from shardlib.predict.training.toy_prediction import (
    LAYOUTS_4,
    STEP_TIME_CONFIG,
    TOY_TIME_SETTINGS,
    average_ranks,
    predict_step,
    spearman,
    step_config,
    step_workload,
    toy_config_settings,
)
from shardlib.ui.training_figures import step_time_table

LINK = Link("test link", 1e9, 1e-3)


# -- Spearman's rank correlation, by hand ---------------------------------------------------------------------
def test_average_ranks_share_ties():
    assert average_ranks([30, 10, 20]) == [3, 1, 2]
    assert average_ranks([5, 1, 5, 2]) == [3.5, 1, 3.5, 2]  # the two 5s span ranks 3 and 4
    assert average_ranks([7, 7, 7]) == [2, 2, 2]


def test_spearman_by_hand():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # ranks (1, 2, 3, 4) against (2, 1, 3, 4): d = (1, 1, 0, 0), 1 - 6 * 2 / (4 * 15) = 0.8
    assert spearman([1, 2, 3, 4], [0.2, 0.1, 0.3, 0.4]) == pytest.approx(0.8)
    # a monotone change of either side leaves it unchanged: it only sees the order
    assert spearman([1, 2, 3, 5], [1, 8, 27, 125]) == pytest.approx(1.0)
    # ties: ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4): Pearson's r of the ranks
    rx, ry = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    mx = my = 2.5
    r = sum((a - mx) * (b - my) for a, b in zip(rx, ry)) / math.sqrt(
        sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(r) == pytest.approx(4.5 / math.sqrt(4.5 * 5))


def test_spearman_refuses_what_has_no_order():
    with pytest.raises(ValueError, match="same length"):
        spearman([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2"):
        spearman([1], [1])
    with pytest.raises(ValueError, match="every value"):
        spearman([1, 1, 1], [1, 2, 3])


# -- one global batch for every layout --------------------------------------------------------------------------
def test_every_layout_trains_the_same_global_batch():
    for layout in LAYOUTS_4.values():
        c = step_config(STEP_TIME_CONFIG, layout, 4)
        assert c.global_batch(layout.dp) == 4
    assert step_config(STEP_TIME_CONFIG, Layout(tp=2, pp=2), 4).m == 4
    assert step_config(STEP_TIME_CONFIG, Layout(tp=2, pp=1, dp=2), 4).m == 2
    with pytest.raises(ValueError, match="does not split"):
        step_config(STEP_TIME_CONFIG, Layout(tp=1, pp=1, dp=4), 6)


# -- the toy cluster's arithmetic and the planner's terms for a toy layout, by hand ----------------------------
def test_the_toy_workload_counts_the_toys_bytes():
    w = step_workload(STEP_TIME_CONFIG, 4)
    assert w.sequence_tokens == 64 and w.global_batch_tokens == 4 * 64 and w.sequences == 4
    assert w.comm_bytes_per_value == 4 and w.kernel_efficiency == 1.0 and w.recompute == ("none",)
    assert w.optimizer_bytes_per_param == 28  # read w, g, m, v; write w, m, v; float32
    assert step_workload(TrainingConfig(dtype="float64"), 4).optimizer_bytes_per_param == 56


def test_the_toy_is_the_planners_model_with_its_settings_listed_once():
    """The toy's workload is the planner's defaults but for what ``TOY_TIME_SETTINGS`` and the config list
    (each differing from the default, so the list is exactly what the toy changes), and its prediction is
    ``score_training`` on it: one model."""
    c, defaults = STEP_TIME_CONFIG, TrainingWorkload()
    w = step_workload(c, 4)
    listed = {**TOY_TIME_SETTINGS, **toy_config_settings(c)}
    assert {k: getattr(defaults, k) == v for k, v in listed.items()} == {k: False for k in listed}
    differs = {f.name for f in dataclasses.fields(TrainingWorkload) if getattr(w, f.name) != getattr(defaults, f.name)}
    assert differs == set(listed) | {"global_batch_tokens"}
    assert {k: getattr(w, k) for k in listed} == listed
    cluster = toy_cluster(LINK, flops_per_s=1e10, nodes=1, ranks_per_node=4)
    for layout in LAYOUTS_4.values():
        config = step_config(c, layout, 4)
        assert predict_step(cluster, layout, c, 4) == score_training(c.model, cluster, layout, w, config.microbatch,
                                                                     "none")


def test_the_planners_terms_for_a_toy_layout_by_hand():
    c = STEP_TIME_CONFIG
    cluster = toy_cluster(LINK, flops_per_s=1e10, nodes=1, ranks_per_node=4)
    s = predict_step(cluster, Layout(tp=2, pp=2), c, 4)
    flops = model_flops_per_token(c.model, c.seq)
    model = c.model  # 6 N over the matrices, LM head included, the embedding (a lookup) and final norm not
    assert flops == 6 * (model.n_params - model.vocab_size * model.d_model - model.d_model) + 12 * 4 * 128 * 64 / 2
    assert s.n_microbatches == 4
    layer = (flops - 6 * 256 * 128) / 4  # two stages of 2 layers, the LM head on the last
    share = (2 * layer + 6 * 256 * 128) / (flops / 2)
    assert s.compute_s == pytest.approx(4 * 64 * flops / (4 * 1e10) * share)
    assert s.bubble_s == pytest.approx((s.compute_s + s.tp_s) / 4)  # (p - 1) slots of m = 4, calls included
    act = 64 * 1 * 128 * 4  # one microbatch's layer input, float32
    one = 2 * (1e-3 + act / 2 / 1e9)  # an all-gather and a reduce-scatter over 2 ranks, one ring step each
    assert s.tp_s == pytest.approx(2 * one * 2 * 2 * 4)  # forward and backward, 2 layers, 4 microbatches
    assert s.pp_s == pytest.approx(2 * (1e-3 + act / 2 / 1e9))  # one hop forward, one back, SP's slice
    assert s.cp_s == 0 and s.dp_s == 0
    assert s.optimizer_s == pytest.approx(s.memory.params * 28 / cluster.memory_bytes_per_s)
    assert s.step_s == pytest.approx(s.compute_s + s.bubble_s + s.tp_s + s.pp_s + s.optimizer_s)
    planner = score_training(c.model, cluster, Layout(tp=2, pp=2), dataclasses.replace(
        step_workload(c, 4), comm_in_bubble=False), 1, "none")  # the planner's default: compute only
    assert planner.bubble_s == pytest.approx(s.compute_s / 4) and planner.tp_s == s.tp_s


def test_without_overlap_the_gradient_sync_is_all_exposed():
    cluster = toy_cluster(LINK, flops_per_s=1e10, nodes=1, ranks_per_node=4)
    layout, c = Layout(tp=2, pp=1, dp=2), STEP_TIME_CONFIG
    s = predict_step(cluster, layout, c, 4)  # the toy's workload: dp_overlap=False
    bucket = s.memory.params * 4 / 4  # one layer's float32 gradients, one reduce-scatter and all-gather each
    assert s.dp_s == pytest.approx(4 * 2 * (1e-3 + bucket / 2 / 1e9))
    hidden = score_training(c.model, cluster, layout, dataclasses.replace(step_workload(c, 4), dp_overlap=True), 1,
                            "none")
    assert hidden.dp_s < s.dp_s and hidden.compute_s == s.compute_s


def test_zero_shards_the_optimizer_pass():
    cluster = toy_cluster(LINK, flops_per_s=1e10, nodes=1, ranks_per_node=4)
    ddp = predict_step(cluster, Layout(tp=2, pp=1, dp=2), STEP_TIME_CONFIG, 4)
    zero3 = predict_step(cluster, Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"), STEP_TIME_CONFIG, 4)
    assert zero3.optimizer_s == pytest.approx(ddp.optimizer_s / 2)


def test_the_planners_defaults_are_unchanged():
    """bf16 on the wire and no optimizer term unless the workload asks: the published plans stay as they were."""
    from shardlib.facts.hardware import H100_80GB, gpu_cluster
    from shardlib.facts.models import LLAMA_3_8B

    w = TrainingWorkload(sequence_tokens=4096, global_batch_tokens=4096 * 64)
    assert w.comm_bytes_per_value == 2 and w.optimizer_bytes_per_param == 0
    s = score_training(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), Layout(2, 2, 2), w, 1, "selective")
    assert s.optimizer_s == 0
    wide = score_training(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), Layout(2, 2, 2),
                          TrainingWorkload(sequence_tokens=4096, global_batch_tokens=4096 * 64,
                                           comm_bytes_per_value=4), 1, "selective")
    assert wide.tp_s > s.tp_s and wide.compute_s == s.compute_s
    with pytest.raises(ValueError, match="comm_bytes_per_value"):
        TrainingWorkload(comm_bytes_per_value=0)


# -- on 4 ranks: structure, not timing ----------------------------------------------------------------------
TINY = TrainingConfig(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=64, seq=16, microbatch=1,
                      steps=2)


@pytest.fixture(scope="module")
def check(pool4):
    return run_step_time_check(pool4, TINY, LAYOUTS_4, global_sequences=4)


def test_every_layout_measured_beside_its_prediction(check):
    assert [t.label for t in check.layouts] == list(LAYOUTS_4)
    fit = check.fit
    for t in check.layouts:
        assert len(t.steps_s) == 1 and t.measured_s == t.steps_s[0]
        assert t.score.n_microbatches == 4 // (TINY.microbatch * t.score.layout.dp)
        # the prediction is the planner's model on the fitted cluster, nothing else
        assert t.score == predict_step(fit.cluster, t.score.layout, TINY, 4)
        assert t.ratio == t.measured_s / t.predicted_s
        assert t.error == pytest.approx(abs(1 - 1 / t.ratio))
    assert check.rank_correlation == spearman([t.predicted_s for t in check.layouts],
                                              [t.measured_s for t in check.layouts])
    for order, key in ((check.by_predicted, "predicted_s"), (check.by_measured, "measured_s")):
        times = {t.label: getattr(t, key) for t in check.layouts}
        assert sorted(order) == sorted(LAYOUTS_4) and [times[k] for k in order] == sorted(times.values())
    # the fit's arithmetic: the FLOP rate from a microbatch's pass, AdamW's rate from its step, the latency
    # at least the sweep's
    assert fit.samples == 5 and [n for n, _ in fit.busy_calls_s] == [2, 4]
    flops = model_flops_per_token(TINY.model, TINY.seq) * TINY.microbatch * TINY.seq
    assert fit.cluster.peak_flops_per_s == pytest.approx(flops / fit.microbatch_s)
    assert fit.cluster.intra_link.latency_s == max(fit.calibration.link.latency_s, dict(fit.busy_calls_s)[2])
    text = step_time_table(check)
    assert "Spearman" in text and all(label in text for label in LAYOUTS_4)


def test_rounds_pool_the_steps_of_every_run(pool4, check):
    two = {k: LAYOUTS_4[k] for k in ("dp2 x tp2", "dp2 x pp2")}
    again = run_step_time_check(pool4, TINY, two, global_sequences=4, rounds=2, fit=check.fit)
    assert again.fit is check.fit  # given: not fitted again
    assert [len(t.steps_s) for t in again.layouts] == [2, 2]
    assert again.only(["dp2 x tp2"]).by_measured == ("dp2 x tp2",)


def test_bad_input_is_refused_before_any_rank_starts(pool4):
    with pytest.raises(ValueError, match="needs 8 ranks"):
        run_step_time_check(pool4, layouts={"dp2 x pp2 x tp2": Layout(tp=2, pp=2, dp=2)})
    with pytest.raises(ValueError, match="warm-up"):
        run_step_time_check(pool4, TrainingConfig(steps=1))


def test_the_ranking_claim_retries_then_says_whether_it_held(monkeypatch, check):
    """The claim's path without the clock: checks whose correlation is set by hand (the same layouts,
    measured steps in the predicted order or reversed), retried until one reaches the floor."""
    monkeypatch.setenv("SHARDLIB_STRICT_CLAIMS", "1")  # as nbval runs the notebooks
    from shardlib.lab.training import step_time

    def with_order(agree: bool):
        order = sorted(check.layouts, key=lambda t: t.predicted_s)
        steps = [(float(i + 1),) for i in range(len(order))][::1 if agree else -1]
        return dataclasses.replace(check, layouts=tuple(dataclasses.replace(t, steps_s=s)
                                                        for t, s in zip(order, steps)))

    runs = iter([with_order(False), with_order(True)])
    seen = []
    monkeypatch.setattr(step_time, "run_step_time_check", lambda ranks, **kw: seen.append(kw) or next(runs))
    again, verdicts = step_time.run_ranking_check(None, layouts=LAYOUTS_4, global_sequences=4)
    assert verdicts[0].held and again.rank_correlation == pytest.approx(1.0) and len(seen) == 2
    assert seen[0] == {"layouts": LAYOUTS_4, "global_sequences": 4}  # the arguments reach the check
    assert verdicts[0].attempts == 2  # the second attempt held
    runs = iter([with_order(False), with_order(False)])
    with pytest.raises(AssertionError, match=r"Spearman.*claimed at least 0.9: not shown this time"):
        step_time.run_ranking_check(None, layouts=LAYOUTS_4)  # under a test run a claim that never held fails
    with pytest.raises(ValueError, match="between 0 and 1"):
        step_time.run_ranking_check(None, chance=1.5)


def test_a_random_order_rarely_reaches_the_floor():
    """Five layouts reach Spearman 0.7 by luck 14 times in 120 orders: the claim needs seven layouts."""
    from shardlib.predict.training.toy_prediction import RANKED_4, chance_of_correlation, floor_for_chance

    assert chance_of_correlation(0.7, 5) == pytest.approx(14 / 120)
    assert chance_of_correlation(-1.0, 4) == 1.0 and chance_of_correlation(1.0, 4) == pytest.approx(1 / 24)
    assert len(RANKED_4) == 7 and floor_for_chance(7) == pytest.approx(5 / 7)
    assert chance_of_correlation(floor_for_chance(7), 7) <= 0.05 < chance_of_correlation(floor_for_chance(7) - 0.04, 7)
    with pytest.raises(ValueError, match="at most 9"):
        chance_of_correlation(0.5, 10)


def test_the_ranking_verdict_says_what_held(check):
    from shardlib.lab.training.step_time import ranking_verdict

    order = sorted(check.layouts, key=lambda t: t.predicted_s)

    def measured_in(order) -> object:  # the first of order measured fastest, and so on
        return dataclasses.replace(check, layouts=tuple(dataclasses.replace(t, steps_s=(float(i + 1),))
                                                        for i, t in enumerate(order)))

    v = ranking_verdict(measured_in(order), 0.5)
    assert v.held and "measured 1;" in v.line and "the same layout fastest both ways" in v.line
    assert "a random order reaches 0.50" in v.line and v.line.endswith("holds")
    w = ranking_verdict(measured_in(order[::-1]), 0.5)
    assert not w.held and "measured -1;" in w.line and "fastest predicted" in w.line and "not shown" in w.line
