"""The 2-D layout on real ranks: equal to the unsharded stack, comm log split by mesh axis as predicted."""

import math

import pytest
import torch

from shardlib.core.checks import TOLERANCE
from shardlib.core.mesh import Layout
from shardlib.core.model import stack_reference
from shardlib.core.toy import activations, stack_weights
from shardlib.facts.hardware import Link, toy_cluster
from shardlib.facts.models import TOY
from shardlib.lab.serving.drivers import check_combined_inputs, run_combined, traffic_by_axis
from shardlib.lab.tensor_parallel.drivers import tp_stack_in_one_process
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.planner import plan_serving

LAYERS = stack_weights(TOY, seed=0)
X = activations(4, 6, TOY.d_model)
REFERENCE = stack_reference(X, LAYERS, TOY)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_single_process_tp_stack_matches_reference(tp):
    out = tp_stack_in_one_process(X, LAYERS, TOY, tp)
    if tp == 1:
        assert torch.equal(out, REFERENCE)
    else:
        assert torch.allclose(out, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE)


def test_single_process_rejects_tp_that_breaks_heads():
    with pytest.raises(ValueError, match="4 KV heads cannot be split 3 ways"):
        tp_stack_in_one_process(X, LAYERS, TOY, 3)


MESHES = {2: [Layout(tp=1, pp=2), Layout(tp=2, pp=1), Layout(tp=1, pp=1, dp=2)],
          4: [Layout(tp=2, pp=2), Layout(tp=4, pp=1), Layout(tp=1, pp=4), Layout(tp=1, pp=2, dp=2),
              Layout(tp=2, pp=1, dp=2)]}


def same_pieces_reference(ctx, layout, n_microbatches):
    """Rank 0 runs the unsharded stack on the very pieces the ranks run (each replica's share, cut into
    microbatches), with the ranks' thread count: a matmul's rounding may depend on how many rows it is
    given and on how many threads share it, so bit-for-bit equality is promised against the same
    pieces computed the same way, not against one whole-batch pass in another process."""
    if ctx.rank:
        return None
    return torch.cat([stack_reference(mb, LAYERS, TOY) for part in X.tensor_split(layout.dp)
                      for mb in part.tensor_split(n_microbatches)])


def _check(run, layout, pool, n_microbatches=2):
    if layout.tp == 1:  # no cross-rank sum: bit for bit against the same pieces
        assert torch.equal(run.output, pool.run(same_pieces_reference, layout, n_microbatches)[0])
    # against one whole-batch pass, and wherever the tp all-reduce adds partials in another order
    assert torch.allclose(run.output, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE)
    assert run.last_stage_agree
    assert run.measured == run.predicted


@pytest.mark.parametrize("world", [2, 4], ids=["world2", "world4"])
def test_every_mesh_equals_the_unsharded_stack_and_its_predicted_traffic(world, request):
    pool = request.getfixturevalue(f"pool{world}")
    for layout in MESHES[world]:
        _check(run_combined(pool, layout, TOY, LAYERS, X, n_microbatches=2), layout, pool)


def test_two_stages_of_two_way_tp_split_the_log_by_axis(pool4):
    run = run_combined(pool4, Layout(tp=2, pp=2), TOY, LAYERS, X, n_microbatches=2)
    _check(run, Layout(tp=2, pp=2), pool4)
    axes = {(a.axis, a.op): (a.count, a.size_bytes) for a in run.measured}
    assert set(axes) == {("tp", "all_reduce"), ("pp", "send"), ("pp", "recv")}
    mb_bytes = 2 * 6 * TOY.d_model * 4  # 2 sequences x 6 tokens x 64 x float32
    # 4 ranks x (4 layers / 2 stages) x 2 all-reduces x 2 microbatches; each one microbatch of activations
    assert axes[("tp", "all_reduce")] == (32, 32 * mb_bytes)
    # 1 boundary x 2 tp ranks x 2 microbatches
    assert axes[("pp", "send")] == (4, 4 * mb_bytes) == axes[("pp", "recv")]
    assert axes[("tp", "all_reduce")][0] == 8 * axes[("pp", "send")][0]  # chatty tp, quiet pp


def test_more_microbatches_mean_more_messages_not_more_bytes(pool4):
    runs = {m: run_combined(pool4, Layout(tp=2, pp=2), TOY, LAYERS, X, n_microbatches=m) for m in (1, 4)}
    for m, run in runs.items():
        _check(run, Layout(tp=2, pp=2), pool4, m)
    sends = {m: next(a for a in r.measured if a.op == "send") for m, r in runs.items()}
    assert sends[4].count == 4 * sends[1].count and sends[4].size_bytes == sends[1].size_bytes


def test_planner_best_toy_layout_runs_with_predicted_bytes(pool4):
    # a fixed link for a deterministic ranking here; the notebook calibrates one live
    p = plan_serving(TOY, toy_cluster(Link("loopback", 1e9, 7e-4)), Workload(batch=4, context_tokens=6, prompt_tokens=6,
                                                                        microbatches=2))
    best = p.best.layout
    run = run_combined(pool4, best, TOY, LAYERS, X, p.best.n_microbatches)
    _check(run, best, pool4, p.best.n_microbatches)  # the measured traffic is the planner's own prediction


def test_bad_meshes_and_inputs_fail_before_any_rank(pool4):
    with pytest.raises(ValueError, match=r"tp x pp x dp = 1 x 2 x 1 = 2, but there are 4 ranks"):
        run_combined(pool4, Layout(tp=1, pp=2), TOY, LAYERS, X)
    with pytest.raises(ValueError, match="4 KV heads cannot be split 8 ways"):
        check_combined_inputs(Layout(tp=8, pp=1), TOY, LAYERS, X, 1)
    check_combined_inputs(Layout(tp=1, pp=3), TOY, LAYERS, X, 1)  # uneven stages (2, 1, 1) are allowed
    with pytest.raises(ValueError, match=r"4 layers cannot fill 5 stages: each stage needs a whole layer"):
        check_combined_inputs(Layout(tp=1, pp=5), TOY, LAYERS, X, 1)
    with pytest.raises(ValueError, match="the combined run on ranks splits dense blocks: ep must be 1, got ep = 2"):
        check_combined_inputs(Layout(tp=2, pp=2, ep=2), TOY, LAYERS, X, 1)
    with pytest.raises(ValueError, match=r"a batch of 4 sequences cannot be cut into dp x m = 1 x 3 = 3"):
        run_combined(pool4, Layout(tp=2, pp=2), TOY, LAYERS, X, n_microbatches=3)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, d_model = 64\)"):
        check_combined_inputs(Layout(tp=2, pp=2), TOY, LAYERS, X[..., :32], 1)
    with pytest.raises(ValueError, match="tp must be a whole number"):
        Layout(tp=0, pp=2)
    # the pool still works after the refusals
    _check(run_combined(pool4, Layout(tp=2, pp=2), TOY, LAYERS, X), Layout(tp=2, pp=2), pool4)


def test_traffic_by_axis_sums_records():
    from shardlib.runtime.records import CommRecord
    recs = [CommRecord("all_reduce", 10, 0.1, "tp", 0, 0.0), CommRecord("all_reduce", 10, 0.1, "tp", 1, 0.0),
            CommRecord("send", 5, 0.1, "pp", 0, 0.0, 2)]
    assert [(a.axis, a.op, a.count, a.size_bytes) for a in traffic_by_axis(recs)] == [
        ("pp", "send", 1, 5), ("tp", "all_reduce", 2, 20)]


def test_measured_toy_cluster_is_built_from_live_numbers(pool4):
    from shardlib.lab.serving.drivers import effective_flops_per_s, run_toy_cluster_calibration

    fit = run_toy_cluster_calibration(pool4, TOY, LAYERS)
    cluster, cal = fit.cluster, fit.calibration
    assert cluster.n_gpus == 4 and cluster.intra_link.latency_s == cal.overall.latency_s
    assert cluster.intra_link.bandwidth_bytes_per_s == cal.overall.bandwidth_bytes_per_s
    assert cluster == toy_cluster(cal.link, flops_per_s=cluster.peak_flops_per_s)  # the fit's link, the toy's shape
    assert math.isfinite(effective_flops_per_s(None, TOY, LAYERS, 2, 6))
    p = plan_serving(TOY, cluster, Workload(batch=4, context_tokens=6, prompt_tokens=6, microbatches=2))
    assert p.ranked and p.best.prefill_s >= p.best.first_token_s  # four prompts take at least as long as one


@pytest.mark.parametrize("bad, words", [
    (0, "n_microbatches must be a whole number of at least 1, got 0"),
    (-1, "n_microbatches must be a whole number of at least 1, got -1"),
    (2.0, "n_microbatches must be a whole number of at least 1, got 2.0"),
])
def test_bad_microbatch_counts_are_refused_before_any_rank_starts(bad, words):
    with pytest.raises(ValueError, match=words):
        check_combined_inputs(Layout(tp=2, pp=2), TOY, LAYERS, X, bad)


def test_input_of_another_dtype_is_refused_with_the_conversion():
    with pytest.raises(ValueError, match="x's dtype is torch.float64 but the weights are torch.float32"):
        check_combined_inputs(Layout(tp=2, pp=2), TOY, LAYERS, X.double(), 1)
