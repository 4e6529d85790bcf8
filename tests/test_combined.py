"""The 2-D layout on real ranks: equal to the unsharded stack, comm log split by mesh axis as predicted."""

import pytest
import torch

from shardlib.combined import (TOLERANCE, Mesh, check_inputs, run_combined, simulate_tp_stack, stack_input,
                               stack_reference, stack_weights, traffic_by_axis)
from shardlib.costs import Link
from shardlib.models import TOY
from shardlib.plan import Workload, forward_traffic, plan, toy_cluster

LAYERS = stack_weights(TOY, seed=0)
X = stack_input(TOY, batch=4, seq=6)
REFERENCE = stack_reference(X, LAYERS, TOY)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_single_process_tp_stack_matches_reference(tp):
    out = simulate_tp_stack(X, LAYERS, TOY, tp)
    if tp == 1:
        assert torch.equal(out, REFERENCE)
    else:
        assert torch.allclose(out, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE)


def test_single_process_rejects_tp_that_breaks_heads():
    with pytest.raises(ValueError, match="4 KV heads cannot be split 3 ways"):
        simulate_tp_stack(X, LAYERS, TOY, 3)


MESHES = {2: [Mesh(2, 1), Mesh(1, 2), Mesh(1, 1, 2)], 4: [Mesh(2, 2), Mesh(1, 4), Mesh(4, 1), Mesh(2, 1, 2), Mesh(1, 2, 2)]}


def same_pieces_reference(ctx, mesh, n_microbatches):
    """Rank 0 runs the unsharded stack on the very pieces the ranks run (each replica's share, cut into
    microbatches), with the ranks' thread count: a matmul's rounding may depend on how many rows it is
    given and on how many threads share it, so bit-for-bit equality is promised against the same
    pieces computed the same way, not against one whole-batch pass in another process."""
    if ctx.rank:
        return None
    return torch.cat([stack_reference(mb, LAYERS, TOY) for part in X.tensor_split(mesh.dp)
                      for mb in part.tensor_split(n_microbatches)])


def _check(run, mesh, pool, n_microbatches=2):
    if mesh.tp == 1:  # no cross-rank sum: bit for bit against the same pieces
        assert torch.equal(run.output, pool.run(same_pieces_reference, mesh, n_microbatches)[0])
    # against one whole-batch pass, and wherever the tp all-reduce adds partials in another order
    assert torch.allclose(run.output, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE)
    assert run.last_stage_agree
    assert run.measured == run.predicted


@pytest.mark.parametrize("world", [2, 4], ids=["world2", "world4"])
def test_every_mesh_equals_the_unsharded_stack_and_its_predicted_traffic(world, request):
    pool = request.getfixturevalue(f"pool{world}")
    for mesh in MESHES[world]:
        _check(run_combined(pool, mesh, TOY, LAYERS, X, n_microbatches=2), mesh, pool)


def test_two_stages_of_two_way_tp_split_the_log_by_axis(pool4):
    run = run_combined(pool4, Mesh(pp=2, tp=2), TOY, LAYERS, X, n_microbatches=2)
    _check(run, Mesh(2, 2), pool4)
    axes = {(a.axis, a.op): (a.count, a.size_bytes) for a in run.measured}
    assert set(axes) == {("tp", "all_reduce"), ("pp", "send"), ("pp", "recv")}
    mb_bytes = 2 * 6 * TOY.d_model * 4  # 2 sequences x 6 tokens x 64 x float32
    # 4 ranks x (4 layers / 2 stages) x 2 all-reduces x 2 microbatches; each one microbatch of activations
    assert axes[("tp", "all_reduce")] == (32, 32 * mb_bytes)
    # 1 boundary x 2 tp ranks x 2 microbatches
    assert axes[("pp", "send")] == (4, 4 * mb_bytes) == axes[("pp", "recv")]
    assert axes[("tp", "all_reduce")][0] == 8 * axes[("pp", "send")][0]  # chatty tp, quiet pp


def test_more_microbatches_mean_more_messages_not_more_bytes(pool4):
    runs = {m: run_combined(pool4, Mesh(2, 2), TOY, LAYERS, X, n_microbatches=m) for m in (1, 4)}
    for m, run in runs.items():
        _check(run, Mesh(2, 2), pool4, m)
    sends = {m: next(a for a in r.measured if a.op == "send") for m, r in runs.items()}
    assert sends[4].count == 4 * sends[1].count and sends[4].size_bytes == sends[1].size_bytes


def test_planner_best_toy_layout_runs_with_predicted_bytes(pool4):
    # a fixed link for a deterministic ranking here; the notebook calibrates one live
    p = plan(TOY, toy_cluster(Link("loopback", 1e9, 7e-4)), Workload(batch=4, context_tokens=6, prompt_tokens=6,
                                                                        microbatches=2))
    best = p.best.layout
    run = run_combined(pool4, Mesh(best.pp, best.tp, best.dp), TOY, LAYERS, X, p.best.n_microbatches)
    _check(run, Mesh(best.pp, best.tp, best.dp), pool4, p.best.n_microbatches)
    assert list(run.measured) == sorted(forward_traffic(TOY, best, 4 // best.dp, 6, p.best.n_microbatches),
                                        key=lambda a: (a.axis, a.op))


def test_bad_meshes_and_inputs_fail_before_any_rank(pool4):
    with pytest.raises(ValueError, match=r"pp x dp x tp = 2 x 1 x 1 = 2, but there are 4 ranks"):
        run_combined(pool4, Mesh(2, 1), TOY, LAYERS, X)
    with pytest.raises(ValueError, match="4 KV heads cannot be split 8 ways"):
        check_inputs(Mesh(1, 8), TOY, LAYERS, X, 1)
    with pytest.raises(ValueError, match=r"4 layers cannot be cut into 3 equal stages \(4 % 3 = 1\)"):
        check_inputs(Mesh(3, 1), TOY, LAYERS, X, 1)
    with pytest.raises(ValueError, match=r"a batch of 4 sequences cannot be cut into dp x m = 1 x 3 = 3"):
        run_combined(pool4, Mesh(2, 2), TOY, LAYERS, X, n_microbatches=3)
    with pytest.raises(ValueError, match=r"x must be \(batch, seq, d_model = 64\)"):
        check_inputs(Mesh(2, 2), TOY, LAYERS, X[..., :32], 1)
    with pytest.raises(ValueError, match="mesh tp must be a whole number"):
        Mesh(2, 0)
    # the pool still works after the refusals
    _check(run_combined(pool4, Mesh(2, 2), TOY, LAYERS, X), Mesh(2, 2), pool4)


def test_traffic_by_axis_sums_records():
    from shardlib.comm import CommRecord
    recs = [CommRecord("all_reduce", 10, 0.1, "tp", 0, 0.0), CommRecord("all_reduce", 10, 0.1, "tp", 1, 0.0),
            CommRecord("send", 5, 0.1, "pp", 0, 0.0, 2)]
    assert [(a.axis, a.op, a.count, a.size_bytes) for a in traffic_by_axis(recs)] == [
        ("pp", "send", 1, 5), ("tp", "all_reduce", 2, 20)]


def test_measured_toy_cluster_is_built_from_live_numbers(pool4):
    from shardlib.combined import effective_flops_per_s, measure_toy_cluster

    cluster, cal = measure_toy_cluster(pool4, TOY, LAYERS)
    assert cluster.n_gpus == 4 and cluster.intra_link.latency_s == cal.overall.latency_s
    assert cluster.intra_link.bandwidth_bytes_per_s == cal.overall.bandwidth_bytes_per_s > 0
    assert cluster.peak_flops_per_s > 0 and effective_flops_per_s(TOY, LAYERS, 2, 6) > 0
    p = plan(TOY, cluster, Workload(batch=4, context_tokens=6, prompt_tokens=6, microbatches=2))
    assert p.ranked and p.best.prefill_s > 0


@pytest.mark.parametrize("bad, words", [
    (0, "n_microbatches must be a whole number of at least 1, got 0"),
    (-1, "n_microbatches must be a whole number of at least 1, got -1"),
    (2.0, "n_microbatches must be a whole number of at least 1, got 2.0"),
])
def test_bad_microbatch_counts_are_refused_before_any_rank_starts(bad, words):
    with pytest.raises(ValueError, match=words):
        check_inputs(Mesh(2, 2), TOY, LAYERS, X, bad)


def test_input_of_another_dtype_is_refused_with_the_conversion():
    with pytest.raises(ValueError, match="x's dtype is torch.float64 but the weights are torch.float32"):
        check_inputs(Mesh(2, 2), TOY, LAYERS, X.double(), 1)
