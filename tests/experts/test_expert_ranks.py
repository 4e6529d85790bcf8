"""Expert parallelism: placement, the dispatch plan, the single-process simulation at 2, 3, 4 and 8
ranks, and the layer on real ranks (2 and 4) against the single-process reference: the mechanism alone
(``dispatch.moe_layer``, measuring nothing) and with the rank function's timing attached.

Tolerance: none. The combine is a gate-weighted sum done at home in the same order as the reference,
and every multiply runs on fixed blocks of rows (see ``routing.blocked_rows``), so the layer on ranks must
reproduce the reference bit for bit: outputs are compared with ``torch.equal``. Capacity is per group of
tokens, each rank's tokens being one group, so the reference is run with as many groups as ranks.
"""

import inspect
import math

import pytest
import torch

from shardlib.core.experts.balance import assign
from shardlib.core.experts.dispatch import make_moe_weights, moe_layer
from shardlib.core.experts.placement import ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, route
from shardlib.facts.models import TOY_MOE
from shardlib.lab.experts.balance import MITIGATIONS, replicate_hottest, run_mitigations
from shardlib.lab.experts.drivers import (
    ep_forward_on_rank,
    make_tokens,
    moe_reference,
    run_expert_parallel,
    token_groups,
)
from shardlib.predict.experts import predicted_all_to_all_bytes, predicted_cross_rank_share, predicted_weight_bytes
from shardlib.runtime.errors import RankError

CFG = MoEConfig.from_model(TOY_MOE)  # 8 experts, top-2, d_model 64, d_ff 128
WEIGHTS = make_moe_weights(CFG, seed=0)
X = make_tokens(512, CFG.d_model, seed=1)


# -- placement -------------------------------------------------------------------------------------------
def test_experts_are_placed_in_contiguous_blocks():
    p = ExpertPlacement(8, 4)
    assert [p.owner(e) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert p.hosted(2) == (4, 5) and p.copies(5) == (2,)
    r = ExpertPlacement(8, 2, replicas=((6, 0),))
    assert r.hosted(0) == (0, 1, 2, 3, 6) and r.hosted(1) == (4, 5, 6, 7) and r.copies(6) == (1, 0)
    assert r.copy_slots[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 6)]


@pytest.mark.parametrize("n_experts, world, shown",
                         [(8, 3, "8 / 3 = 2.67"), (8, 16, "8 / 16 = 0.5"), (6, 4, "6 / 4 = 1.5")])
def test_experts_that_cannot_be_placed_name_the_numbers(n_experts, world, shown):
    with pytest.raises(ValueError, match=f"{n_experts} experts cannot be placed on {world} ranks: expert parallelism "
                                         f"gives each rank the same whole number of experts \\({shown}\\)"):
        ExpertPlacement(n_experts, world)


@pytest.mark.parametrize("replicas, words", [
    (((1, 0),), "expert 1 already lives on rank 0: its replica must go to another rank"),
    (((9, 1),), "names expert 9 of 0 .. 7 on rank 1 of 0 .. 1"),
    (((0, 2),), "names expert 0 of 0 .. 7 on rank 2 of 0 .. 1"),
    (((0, 1), (0, 1)), "expert 0 has more than one replica"),
    ((6, 0), r"replicas must be \(expert, rank\) pairs, for example \(\(6, 0\),\); got 6"),
    (((1.7, 0),), "a replica's expert must be a whole number of at least 0, got 1.7"),
])
def test_bad_replicas_say_why(replicas, words):
    with pytest.raises(ValueError, match=words):
        ExpertPlacement(8, 2, replicas=replicas)


def test_replicate_the_hottest_expert_on_the_least_loaded_other_rank():
    counts = [10, 1, 1, 1, 5, 9, 2, 2]  # rank loads (2 experts each): 11, 2, 14, 4
    assert replicate_hottest(ExpertPlacement(8, 4), counts).replicas == ((0, 1),)
    counts = [1, 1, 1, 1, 1, 1, 1, 30]  # expert 7 on rank 3; ranks 0, 1, 2 tie at 2: the lowest wins
    assert replicate_hottest(ExpertPlacement(8, 4), counts).replicas == ((7, 0),)
    with pytest.raises(ValueError, match="expert_counts has 3 entries, one per expert is 8"):
        replicate_hottest(ExpertPlacement(8, 4), [1, 2, 3])


# -- the dispatch plan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("replicas", [(), ((0, 1),)])
def test_dispatch_sends_every_served_slot_exactly_once(replicas):
    cfg = CFG.but(skew=0.7, capacity_factor=1.0)
    placement = ExpertPlacement(8, 2, replicas)
    a = assign(route(X, WEIGHTS.router, cfg), cfg)
    plan = dispatch_plan(a.experts, a.kept, placement)
    served = torch.nonzero(a.kept.flatten()).flatten()
    assert sorted(plan.order.tolist()) == served.tolist()  # each served slot once, no dropped slot
    assert int(plan.counts.sum()) == sum(plan.rows_to_rank) == served.numel()
    dest = [placement.copy_slots[i][0] for i, c in enumerate(plan.counts.tolist()) for _ in range(c)]
    assert dest == sorted(dest)  # the send buffer is grouped by destination rank
    sent_expert = a.experts.flatten()[plan.order].tolist()
    expected = [placement.copy_slots[i][1] for i, c in enumerate(plan.counts.tolist()) for _ in range(c)]
    assert sent_expert == expected  # and within a rank, by expert, as the counts say
    if replicas:  # the hot expert's rows alternate between its two copies
        halves = [plan.counts[placement.copy_slots.index(c)].item() for c in ((0, 0), (1, 0))]
        assert abs(halves[0] - halves[1]) <= 1 and sum(halves) == a.counts(8)[0].item()


@pytest.mark.parametrize("k, skew", [(1, 0.0), (2, 0.0), (1, 0.9), (2, 0.9)])
def test_every_policy_and_a_replica_on_ranks_equal_the_reference_exactly(pool, k, skew):
    cfg, world = CFG.but(k=k, skew=skew), pool.world_size
    weights = make_moe_weights(cfg, seed=2)
    placement = ExpertPlacement(8, world)
    for policy in (cfg, cfg.but(capacity_factor=1.0), cfg.but(capacity_factor=1.0, reroute=True)):
        ref = moe_reference(X, weights, policy, n_groups=world)
        run = run_expert_parallel(pool, X, weights, policy, placement)
        assert torch.equal(run.output, ref.output)
        served = ref.assignment.counts(8).sum().item()
        assert sum(map(sum, run.send_matrix)) == sum(run.expert_rows) == served  # tokens conserved
        hot = replicate_hottest(placement, ref.assignment.counts(8))
        assert torch.equal(run_expert_parallel(pool, X, weights, policy, hot).output, ref.output)


def test_predicted_bytes_by_hand():
    assert predicted_all_to_all_bytes(4096, 2, 64) == 4096 * 2 * 64 * 4 == 2_097_152
    assert predicted_cross_rank_share(2) == 0.5 and predicted_cross_rank_share(4) == 0.75
    one = 3 * 64 * 128 * 4  # gate, up, down of one expert: 98,304 bytes
    assert predicted_weight_bytes(ExpertPlacement(8, 2), CFG) == [4 * one, 4 * one]
    assert predicted_weight_bytes(ExpertPlacement(8, 4, ((0, 3),)), CFG) == [2 * one, 2 * one, 2 * one, 3 * one]


# -- on real ranks -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("skew", [0.0, 0.9])
def test_the_layer_on_ranks_equals_the_reference_exactly(pool, k, skew):
    cfg = CFG.but(k=k, skew=skew)
    run = run_expert_parallel(pool, X, WEIGHTS, cfg)
    ref = moe_reference(X, WEIGHTS, cfg)
    assert torch.equal(run.output, ref.output)
    owner, a = torch.arange(8) // (8 // pool.world_size), ref.assignment  # each expert's rank
    sent = [torch.bincount(owner[e[kept]], minlength=pool.world_size).tolist()  # from each home rank's routing
            for e, kept in zip(token_groups(a.experts, pool.world_size), token_groups(a.kept, pool.world_size))]
    assert run.send_matrix == sent and run.expert_rows == [sum(col) for col in zip(*sent)]
    assert torch.equal(run.expert_counts, ref.assignment.counts(8))
    # the comm log's bytes: token rows in, the same rows back, nothing dropped, as predicted
    predicted = predicted_all_to_all_bytes(X.shape[0], k, CFG.d_model)
    assert run.dispatch_bytes == run.combine_bytes == predicted
    hosted = 8 // pool.world_size
    assert run.counts_bytes == pool.world_size * pool.world_size * hosted * 8  # int64 counts per expert
    assert run.weight_bytes == [hosted * WEIGHTS.expert_bytes] * pool.world_size


def test_the_mechanism_alone_equals_the_reference_and_measures_nothing(pool):
    """``moe_layer`` called with its default probe, as a learner would call it in a cell: the same output,
    three all-to-alls per rank (counts, rows out, rows back), and no compute spans."""
    def forward(ctx, x, weights, cfg, placement):
        home = token_groups(x, ctx.world_size)[ctx.rank]
        experts = weights.experts(placement.hosted(ctx.rank))
        return home + moe_layer(home, weights.router, experts, cfg, ctx=ctx, placement=placement).output

    cfg = CFG.but(skew=0.5)
    outputs = pool.run(forward, X, WEIGHTS, cfg, ExpertPlacement(8, pool.world_size))
    assert torch.equal(torch.cat(outputs), moe_reference(X, WEIGHTS, cfg).output)
    assert [r.op for r in pool.last_comm] == ["all_to_all_single"] * 3 * pool.world_size
    assert [s for s in pool.last_spans if s.kind == "compute"] == []


def test_the_mechanism_holds_no_measurement_and_the_rank_function_attaches_it(pool2):
    source = inspect.getsource(inspect.getmodule(moe_layer))
    for word in ("import time", "now_s", "perf_counter", "process_time", "sleep", "timeline", "records"):
        assert word not in source
    run_expert_parallel(pool2, X, WEIGHTS, CFG, repeats=2)
    for rank in range(2):
        names = [s.name for s in pool2.last_spans if s.rank == rank and s.kind == "compute"]
        assert names == ["route", "experts", "weighted sum"] * 2
    experts = [s for s in pool2.last_spans if s.name == "experts"]
    assert sum(s.attrs["rows"] for s in experts) == 2 * X.shape[0] * CFG.k  # every slot, each repeat


def test_capacity_rerouting_and_replication_on_ranks_stay_exact(pool):
    world = pool.world_size
    for cfg in (CFG.but(skew=0.8, capacity_factor=1.0), CFG.but(k=1, skew=0.8, capacity_factor=0.75, reroute=True)):
        ref = moe_reference(X, WEIGHTS, cfg, world)
        placement = replicate_hottest(ExpertPlacement(8, world), ref.assignment.counts(8))
        for p in (ExpertPlacement(8, world), placement):
            run = run_expert_parallel(pool, X, WEIGHTS, cfg, p)
            assert torch.equal(run.output, ref.output)
            assert run.dropped_slots == ref.assignment.dropped_slots > 0
            assert run.rerouted_slots == ref.assignment.rerouted_slots
            assert run.dispatch_bytes == (X.shape[0] * cfg.k - run.dropped_slots) * CFG.d_model * 4
        assert run.weight_bytes[placement.replicas[0][1]] == (8 // world + 1) * WEIGHTS.expert_bytes
        assert run.weight_bytes == predicted_weight_bytes(placement, cfg)
    rescore = CFG.but(k=2, skew=0.8, capacity_factor=1.0, reroute=True, reroute_gate="rescore")
    run = run_expert_parallel(pool, X, WEIGHTS, rescore)
    assert run.rerouted_slots > 0 and torch.equal(run.output, moe_reference(X, WEIGHTS, rescore, world).output)


def test_replication_lowers_the_busiest_ranks_load(pool2):
    cfg = CFG.but(skew=1.0)
    plain, copied = run_mitigations(pool2, X, WEIGHTS, cfg, ("none", "replicate hottest"), repeats=1).values()
    assert copied.rank_load.max_over_mean < plain.rank_load.max_over_mean and plain.rank_load.max_over_mean > 1.3
    assert copied.expert_load.max_over_mean == plain.expert_load.max_over_mean  # the expert is as busy, in two places
    assert copied.exact and copied.tokens_changed == 0 and copied.run.dropped_slots == 0
    uncapped, capped, rerouted = run_mitigations(pool2, X, WEIGHTS, CFG.but(k=1, skew=0.8), MITIGATIONS[:3],
                                                 capacity_factor=1.0, repeats=1).values()
    assert capped.exact and rerouted.exact
    assert capped.run.dropped_tokens == capped.run.dropped_slots > rerouted.run.dropped_slots
    assert capped.tokens_changed == capped.run.dropped_tokens  # k = 1: exactly the dropped tokens change
    # the cap holds the busiest expert to capacity_factor (1.0) times the even share of the batch
    assert uncapped.expert_load.max_over_mean > 4
    assert capped.expert_load.max_over_mean == rerouted.expert_load.max_over_mean == 1.0
    assert capped.run.expert_counts.max().item() == 2 * capped.run.capacity  # full on both ranks
    with pytest.raises(ValueError, match="unknown mitigation 'pray'"):
        run_mitigations(pool2, X, WEIGHTS, cfg, ("pray",))


def test_every_mitigation_by_label_in_order(pool2):
    x = X[:128]
    measured = run_mitigations(pool2, x, WEIGHTS, CFG.but(k=1, skew=0.8), capacity_factor=1.0, repeats=1)
    assert tuple(measured) == MITIGATIONS and all(m.exact and m.label == k for k, m in measured.items())
    assert measured["capacity"].run.dropped_slots > 0


def test_every_rank_waits_for_the_slowest_ranks_experts(pool2):
    """A set cost per expert row (a sleep, on top of the real FFN). At skew 1 rank 0 holds the hot expert and
    gets most rows (counted, not timed); in every repeat no rank finished before the last rank's experts did
    (the combine cannot end sooner: an order of events, not a duration). How much longer the skewed step
    takes is the notebook's claim and the benchmark's."""
    x = make_tokens(1024, CFG.d_model, seed=4)
    per_row_s = 1e-4
    skewed = run_expert_parallel(pool2, x, WEIGHTS, CFG.but(skew=1.0), repeats=3, extra_s_per_row=per_row_s)
    even = run_expert_parallel(pool2, x, WEIGHTS, CFG, repeats=3, extra_s_per_row=per_row_s)
    assert skewed.expert_rows[0] > 1.3 * skewed.expert_rows[1]  # rows: counted, not timed
    assert max(skewed.expert_rows) > max(even.expert_rows)
    for run in (skewed, even):
        assert run.waited_for_slowest  # no rank finished before the last rank's experts did
        # the step spans every rank's experts, each padded by a sleep: floors, which sleeps only ever overshoot
        assert run.step_s >= max(run.expert_s) >= max(run.expert_rows) * per_row_s


def test_expert_cpu_time_is_measured_per_rank_beside_its_rows(pool2):
    """Experts wide enough to dominate their own timing, at skew 1: rank 0 computes more than twice the rows
    of rank 1 (counted), and each rank's CPU time is measured (a positive, finite number of seconds). That
    the CPU times follow the rows is the notebook's claim (``run_stall_check``) and the benchmark's."""
    wide = CFG.but(d_ff=512, skew=1.0)
    x = make_tokens(2048, CFG.d_model, seed=5)
    run = run_expert_parallel(pool2, x, make_moe_weights(wide, seed=0), wide, repeats=3)
    assert run.expert_rows[0] > 2 * run.expert_rows[1]  # rows: counted, not timed
    assert len(run.expert_cpu_s) == 2 and all(math.isfinite(t) and t > 0 for t in run.expert_cpu_s)
    assert len(run.expert_cpu_floor_s) == 2 and all(f <= t for f, t in zip(run.expert_cpu_floor_s, run.expert_cpu_s))


def test_bad_inputs_are_refused_before_the_ranks_are_involved(pool4):
    with pytest.raises(ValueError, match="6 experts cannot be placed on 4 ranks"):
        run_expert_parallel(pool4, X, make_moe_weights(CFG.but(n_experts=6)), CFG.but(n_experts=6))
    with pytest.raises(ValueError, match="3 tokens cannot be split into 4 groups"):
        run_expert_parallel(pool4, X[:3], WEIGHTS, CFG)
    with pytest.raises(ValueError, match="d_model = 64, got \\(512, 32\\)"):
        run_expert_parallel(pool4, torch.zeros(512, 32), WEIGHTS, CFG)
    with pytest.raises(ValueError, match="placement is for 8 experts on 2 ranks, but the layer has 8 experts on 4"):
        run_expert_parallel(pool4, X, WEIGHTS, CFG, ExpertPlacement(8, 2))
    with pytest.raises(ValueError, match="repeats must be a whole number of at least 1, got 0"):
        run_expert_parallel(pool4, X, WEIGHTS, CFG, repeats=0)
    with pytest.raises(ValueError, match=r"extra_s_per_row \(seconds\) must be a number of at least 0, got -1"):
        run_expert_parallel(pool4, X, WEIGHTS, CFG, extra_s_per_row=-1)
    with pytest.raises(ValueError, match="the tokens' dtype is torch.float64 but the weights are torch.float32"):
        run_expert_parallel(pool4, X.double(), WEIGHTS, CFG)
    # called straight on the ranks, the rank-side check names the problem too
    with pytest.raises(RankError, match="placement is for 8 experts on 2 ranks"):
        pool4.run(ep_forward_on_rank, X, WEIGHTS, CFG, ExpertPlacement(8, 2))
    assert torch.equal(run_expert_parallel(pool4, X, WEIGHTS, CFG).output, moe_reference(X, WEIGHTS, CFG).output)


def test_the_knob_app_runs_the_layer_live_and_clamps(pool2):
    from shardlib.ui.experts_widgets import expert_explorer

    app = expert_explorer(pool2, X, WEIGHTS, CFG, repeats=1)
    controls, summary, figures, time_fig, feedback = app.children
    (skew, k), (capped, factor), (reroute, replicate) = (box.children for box in controls.children)
    assert "equals the single-process layer exactly" in summary.value and reroute.disabled
    matrix_fig, load_fig = figures.children
    assert sum(map(sum, matrix_fig.figure.data[0].z)) == X.shape[0] * 2
    skew.value = 1.0
    assert list(load_fig.figure.data[0].y)[0] == X.shape[0]  # every token's first choice: expert 0
    capped.value = True
    assert not reroute.disabled and "dropped slots" in summary.value
    assert "dropped slots 0," not in summary.value
    reroute.value = True
    replicate.value = True
    assert "copied to rank 1" in summary.value and "equals the single-process layer exactly" in summary.value
    factor.value = 99  # clamped
    skew.value = -3
    assert factor.value == 3.0 and skew.value == 0.0
    capped.value = False
    assert reroute.value is False and reroute.disabled


# -- figures ----------------------------------------------------------------------------------------------------
def test_the_walkthrough_has_five_steps_with_the_routers_choices():
    from shardlib.ui.experts_figures import STAGES, walkthrough_figure

    experts, gates = [[0, 1], [0, 3], [2, 0], [3, 2]], [[0.6, 0.4]] * 4
    fig = walkthrough_figure([0, 0, 1, 1], experts, gates, owner=[0, 0, 1, 1])
    assert [f.layout.title.text for f in fig.frames] == list(STAGES)
    assert [t.split(" · ")[0] for t in STAGES] == ["1", "2", "3", "4", "5"]  # five steps, in order
    copies = {f.name: f.data[3] for f in fig.frames}  # one marker per (token, slot)
    assert all(len(c.x) == 8 for c in copies.values())
    crossing = fig.frames[1].data[1]  # routes that leave their home rank: t1 -> E3 and t2 -> E0
    assert sum(1 for v in crossing.x if v is None) == 2
    assert list(fig.frames[2].data[2].text) == ["E0 (3)", "E1 (1)", "E2 (2)", "E3 (2)"]  # rows per expert
    busy = fig.frames[4].data[4]
    assert [t for t in busy.text if t] == ["4 rows", "4 rows"]
    with pytest.raises(ValueError, match="4 home ranks but 3 expert rows"):
        walkthrough_figure([0, 0, 1, 1], experts[:3], gates, [0, 0, 1, 1])


def test_the_figures_show_what_the_ranks_reported():
    from shardlib.ui.experts_figures import (
        expert_load_figure,
        rank_time_figure,
        send_matrix_figure,
    )

    assert [list(row) for row in send_matrix_figure([[5, 1], [2, 7]]).data[0].z] == [[5, 1], [2, 7]]
    load = expert_load_figure([4, 0, 2, 2], owner=[0, 0, 1, 1], capacity_total=3)
    assert list(load.data[0].y) == [4, 0, 2, 2] and len(load.layout.shapes) == 2  # even share and capacity
    assert load.data[0].marker.color[0] != load.data[0].marker.color[2]  # coloured by rank
    times = rank_time_figure([0.01, 0.002], [0.012, 0.012], 0.0125, [0.009, 0.002])
    assert [list(b.y) for b in times.data] == [[10.0, 2.0], [9.0, 2.0], [12.0, 12.0]]
    with pytest.raises(ValueError, match="square"):
        send_matrix_figure([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match="2 expert times but 1 forward times"):
        rank_time_figure([1, 2], [1], 1)
    with pytest.raises(ValueError, match="3 loads but 2 owners"):
        expert_load_figure([1, 2, 3], [0, 1])


def test_exact_means_bit_for_bit_even_when_this_process_has_more_threads_than_a_rank(pool):
    # wide experts: a float32 matmul over more threads may add its partial sums in another order, so the
    # driver computes its references with a rank's threads
    wide = CFG.but(d_ff=1024)
    before = torch.get_num_threads()
    torch.set_num_threads(max(2, pool.threads_per_rank + 1))
    try:
        m = run_mitigations(pool, make_tokens(2048, wide.d_model, seed=1), make_moe_weights(wide, seed=0), wide,
                            ("none",), repeats=1)["none"]
    finally:
        torch.set_num_threads(before)
    assert m.exact and m.tokens_changed == 0
