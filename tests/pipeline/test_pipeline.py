"""Pipeline parallelism on paper: the bubble formulas, schedules as data, and what a schedule predicts.

Everything here is exact arithmetic (whole-number slot durations give fractions), so the checks are
equalities, not tolerances.
"""

from collections import Counter
from fractions import Fraction

import pytest

from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.schedules import Action, Schedule, check_schedule, simulate
from shardlib.core.pipeline.stages import split_layers, stage_layer_counts
from shardlib.predict.pipeline import (
    idle_slots,
    measure_bubble,
    measured_in_flight,
    messages_per_step,
    microbatch_sizes,
    microbatch_trips,
    peak_in_flight,
    pipeline_bubble_fraction,
    pipeline_bubble_ratio_to_ideal,
    predicted_step_s,
    stage_imbalance,
    step_slots,
)
from shardlib.runtime.timeline import Span
from shardlib.ui.tables import order_text, schedule_text


def _all_schedules():
    for name in ("gpipe", "1f1b"):
        for training in (True, False):
            for p in range(1, 6):
                for m in range(1, 10):
                    yield make_schedule(name, p, m, training)
    for training in (True, False):
        for p in (1, 2, 3, 4):
            for v in (2, 3):
                for m in (p, 2 * p, 3 * p):
                    yield make_schedule("interleaved-1f1b", p, m, training, n_chunks=v)


# -- the formulas ------------------------------------------------------------------------------------
def test_bubble_fraction_values_and_limits():
    assert pipeline_bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert pipeline_bubble_fraction(2, 1) == pytest.approx(1 / 2)
    assert pipeline_bubble_fraction(4, 1) == pytest.approx(3 / 4)  # one microbatch: one stage busy at a time
    assert pipeline_bubble_fraction(8, 32) == pytest.approx(7 / 39)
    for m in (1, 2, 7, 100):
        assert pipeline_bubble_fraction(1, m) == 0.0  # one stage: nothing to fill or drain
    fractions = [pipeline_bubble_fraction(4, m) for m in range(1, 200)]
    assert all(a > b for a, b in zip(fractions, fractions[1:]))  # more microbatches, smaller bubble
    assert pipeline_bubble_fraction(4, 10**6) < 1e-5  # tends to 0
    assert all(0 <= f < 1 for f in fractions)


def test_the_ratio_to_ideal_convention():
    assert pipeline_bubble_ratio_to_ideal(4, 8) == pytest.approx(3 / 8)
    assert pipeline_bubble_ratio_to_ideal(4, 1) == pytest.approx(3.0)  # not a share: it can pass 1
    assert pipeline_bubble_ratio_to_ideal(1, 5) == 0.0
    for p, m, v in ((2, 1, 1), (4, 8, 1), (8, 3, 1), (4, 8, 2), (3, 9, 3)):
        ratio = pipeline_bubble_ratio_to_ideal(p, m, v)
        assert pipeline_bubble_fraction(p, m, v) == pytest.approx(ratio / (1 + ratio))
    assert pipeline_bubble_ratio_to_ideal(4, 8, n_chunks=2) == pytest.approx(3 / 16)  # Megatron: (p-1)/(v m)


@pytest.mark.parametrize("call, words", [
    (lambda: pipeline_bubble_fraction(0, 4),
     r"n_stages \(pipeline stages\) must be a whole number of at least 1, got 0"),
    (lambda: pipeline_bubble_fraction(4, 0), r"n_microbatches \(microbatches per step\) .* got 0"),
    (lambda: pipeline_bubble_fraction(4, -2), "got -2"),
    (lambda: pipeline_bubble_fraction(4, 2.5), "got 2.5"),
    (lambda: pipeline_bubble_fraction(True, 4), "got True"),
    (lambda: pipeline_bubble_ratio_to_ideal(2, 0), "n_microbatches"),
    (lambda: pipeline_bubble_fraction(2, 4, n_chunks=0), "n_chunks"),
    (lambda: make_schedule("zigzag", 2, 4),
     r"no pipeline schedule called 'zigzag'; the schedules are 'gpipe', '1f1b', 'interleaved-1f1b'"),
    (lambda: make_schedule("gpipe", 0, 4), "n_stages"),
    (lambda: make_schedule("1f1b", 2, 0), "n_microbatches"),
    (lambda: make_schedule("gpipe", 2, 4, training="yes"),
     r"training \(True: forward and backward; False: forward only\) must be True or False, got 'yes'"),
    (lambda: make_schedule("gpipe", 2, 4, n_chunks=2), "needs 'interleaved-1f1b'"),
    (lambda: make_schedule("interleaved-1f1b", 4, 6, n_chunks=2), "must be a multiple of 4; got 6"),
    (lambda: make_schedule("interleaved-1f1b", 2, 4, n_chunks=1), "at least 2 model chunks"),
    (lambda: split_layers(3, 4), "cannot cut 3 layers into 4 slices: each slice needs at least one whole layer"),
    (lambda: split_layers(0, 1), "n_layers"),
    (lambda: microbatch_sizes(4, 8), "cannot cut a batch of 4 rows into 8 microbatches"),
    (lambda: split_layers(6, 4, [2, 2, 2]), r"3 layer counts \[2, 2, 2\] for 4 slices: give one per slice"),
    (lambda: split_layers(6, 4, [2, 2, 2, 1]), r"add up to 7, but the model has 6 layers"),
    (lambda: split_layers(6, 4, [3, 2, 1, 0]), "layer count of slice 3"),
    (lambda: split_layers(6, 2, "33"), "one per slice"),
    (lambda: stage_layer_counts(4, 4, end_layers=1), "each stage needs at least one whole layer"),
    (lambda: stage_layer_counts(8, 4, end_layers=-1), "end_layers must be a whole number"),
    (lambda: stage_imbalance([2, 0]), "positive"),
    (lambda: simulate(make_schedule("gpipe", 3, 2), hop_s=-5),
     r"hop_s \(seconds per op\) must be a number of at least 0, got -5"),
    (lambda: simulate(make_schedule("gpipe", 3, 2), hop_s=True),
     r"hop_s \(seconds per op\) must be a number of at least 0, got True"),
])
def test_bad_inputs_say_which_rule_broke(call, words):
    with pytest.raises(ValueError, match=words):
        call()


def test_stages_may_hold_unequal_layer_counts():
    """Llama 3 405B: 126 layers on 16 stages, the first and last one layer lighter for the embedding and
    the loss (Llama 3 paper, 3.3.2); 4 even stages are 32, 32, 31, 31. Counts set per stage are kept."""
    llama = stage_layer_counts(126, 16, end_layers=1)
    assert llama == (7,) + (8,) * 14 + (7,) and sum(llama) == 126
    assert stage_layer_counts(126, 4) == (32, 32, 31, 31) == tuple(len(r) for r in split_layers(126, 4))
    assert stage_layer_counts(6, 4, end_layers=1) == (1, 2, 2, 1)
    assert stage_layer_counts(5, 1, end_layers=1) == (5,)
    assert split_layers(6, 4, [1, 2, 2, 1]) == (range(0, 1), range(1, 3), range(3, 5), range(5, 6))
    # the slowest stage's work against the mean: even layers plus the end work, against the lighter ends
    assert stage_imbalance([len(r) for r in split_layers(126, 16)]) == pytest.approx(8 / 7.875)
    with_ends = [c + e for c, e in zip([len(r) for r in split_layers(126, 16)], [1] + [0] * 14 + [1])]
    assert stage_imbalance(with_ends) == pytest.approx(9 / 8)
    assert stage_imbalance([c + e for c, e in zip(llama, [1] + [0] * 14 + [1])]) == 1.0


@pytest.mark.parametrize("stage_s", [[1, 2, 2, 1], [3, 1, 1], [2, 2], [1, 1, 4, 1]])
@pytest.mark.parametrize("m", [1, 3, 8])
def test_the_slowest_stage_sets_the_pace_of_a_pass(stage_s, m):
    """``sum(t) + (m - 1) max(t)`` is what the schedule's simulation gives for a forward-only GPipe pass."""
    schedule = make_schedule("gpipe", len(stage_s), m, training=False)
    assert predicted_step_s(schedule, stage_s, 0) == sum(stage_s) + (m - 1) * max(stage_s)
    assert predicted_step_s(make_schedule("gpipe", 4, m, training=False), 2, 0) == (m + 4 - 1) * 2


def test_layers_and_rows_are_cut_contiguously():
    assert split_layers(8, 4) == (range(0, 2), range(2, 4), range(4, 6), range(6, 8))
    assert split_layers(7, 3) == (range(0, 3), range(3, 5), range(5, 7))
    assert split_layers(4, 4) == tuple(range(i, i + 1) for i in range(4))
    assert microbatch_sizes(16, 4) == (4, 4, 4, 4)
    assert microbatch_sizes(10, 4) == (3, 3, 2, 2)  # as torch.tensor_split cuts


# -- schedules as data ---------------------------------------------------------------------------------
def test_every_action_exactly_once_on_its_own_stage():
    for s in _all_schedules():
        ops = ("F", "B") if s.training else ("F",)
        counts = Counter(a for row in s.actions for a in row)
        expected = {Action(st, i, op, c) for st in range(s.n_stages) for i in range(s.n_microbatches)
                    for op in ops for c in range(s.n_chunks)}
        assert set(counts) == expected, s.title
        assert set(counts.values()) == {1}, s.title
        assert all(a.stage == st for st, row in enumerate(s.actions) for a in row)


def test_every_action_starts_after_what_it_consumes():
    """Dependencies, checked directly on the simulated times: a forward after the previous virtual
    stage's forward of that microbatch, a backward after the next virtual stage's backward (the last
    virtual stage's after its own forward); and a stage runs its list in order, one at a time."""
    for s in _all_schedules():
        timed = {t.action: t for t in simulate(s)}
        vs_count = s.n_virtual_stages
        for a, t in timed.items():
            vs = s.virtual_stage(a)
            if a.op == "F" and vs > 0:
                assert t.start_s >= timed[s.at_virtual_stage(vs - 1, a.microbatch, "F")].end_s
            if a.op == "B":
                before = s.at_virtual_stage(vs, a.microbatch, "F") if vs == vs_count - 1 else \
                    s.at_virtual_stage(vs + 1, a.microbatch, "B")
                assert t.start_s >= timed[before].end_s
                assert t.start_s >= timed[s.at_virtual_stage(vs, a.microbatch, "F")].end_s
        for row in s.actions:
            for a, b in zip(row, row[1:]):
                assert timed[b].start_s >= timed[a].end_s


def test_idle_slots_counted_from_the_schedule_equal_the_formula():
    for s in _all_schedules():
        idle, step = idle_slots(s), step_slots(s)
        busy = sum(len(row) for row in s.actions)
        assert sum(idle) + busy == s.n_stages * step
        expected = Fraction(s.n_stages - 1, s.n_chunks * s.n_microbatches + s.n_stages - 1)
        assert Fraction(sum(idle), s.n_stages * step) == expected, s.title
        if s.n_chunks == 1:  # each stage idles (p - 1) slots per pass: fill plus drain
            passes = 2 if s.training else 1
            assert idle == (passes * (s.n_stages - 1),) * s.n_stages


def test_a_served_pass_is_forward_only_and_idles_the_formula():
    """A server's pass (``training=False``): every stage runs F0 .. F(m-1) in order, GPipe's and 1F1B's lists
    are one list, nothing is held for a backward, and the idle share is (p - 1) / (m + p - 1) of the pass."""
    for p, m in ((1, 3), (2, 4), (4, 8), (4, 2)):
        served = make_schedule("gpipe", p, m, training=False)
        assert served.actions == make_schedule("1f1b", p, m, training=False).actions
        assert [[(a.op, a.microbatch) for a in row] for row in served.actions] == [[("F", i) for i in range(m)]] * p
        assert peak_in_flight(served) == (0,) * p and step_slots(served) == m + p - 1
        assert Fraction(sum(idle_slots(served)), p * step_slots(served)) == Fraction(p - 1, m + p - 1)
    with pytest.raises(ValueError, match="forward only, it is plain 1F1B"):
        make_schedule("zb-h1", 2, 4, training=False)


def test_a_hand_worked_1f1b_and_gpipe():
    one_f_one_b = make_schedule("1f1b", 2, 3)
    assert order_text(one_f_one_b) == {0: "F0 F1 B0 F2 B1 B2", 1: "F0 B0 F1 B1 F2 B2"}
    assert schedule_text(one_f_one_b) == ("stage 0: F0 F1 .  B0 F2 B1 .  B2\n"
                                          "stage 1: .  F0 B0 F1 B1 F2 B2 .")
    gpipe = make_schedule("gpipe", 2, 2)
    assert schedule_text(gpipe) == "stage 0: F0 F1 .  .  B0 B1\nstage 1: .  F0 F1 B0 B1 ."
    forward_only = make_schedule("1f1b", 3, 2, training=False)
    assert order_text(forward_only) == order_text(make_schedule("gpipe", 3, 2, training=False))
    assert schedule_text(forward_only) == "stage 0: F0 F1 .  .\nstage 1: .  F0 F1 .\nstage 2: .  .  F0 F1"


def test_the_interleaved_order_follows_megatron():
    """Stage 0 of p = 2, v = 2, m = 4: (v - 1) p + 2 (p - 1) = 4 forwards first, in groups of p
    microbatches per chunk; backwards walk the chunks in reverse."""
    s = make_schedule("interleaved-1f1b", 2, 4, n_chunks=2)
    assert order_text(s)[0] == "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"
    assert order_text(s)[1] == "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3"


def test_peak_in_flight_gpipe_holds_m_1f1b_holds_p():
    for p in (1, 2, 4, 8):
        for m in (1, 3, 8, 16):
            assert peak_in_flight(make_schedule("gpipe", p, m)) == (m,) * p
            assert peak_in_flight(make_schedule("1f1b", p, m)) == tuple(min(p - s, m) for s in range(p))
            assert peak_in_flight(make_schedule("1f1b", p, m, training=False)) == (0,) * p


def test_predicted_step_time():
    assert predicted_step_s(make_schedule("gpipe", 4, 8), 1, 2) == (8 + 3) * 3
    assert predicted_step_s(make_schedule("1f1b", 4, 8), 1, 2) == (8 + 3) * 3  # same bubble as GPipe
    assert predicted_step_s(make_schedule("gpipe", 4, 8, training=False), 0.5, 0) == pytest.approx(11 * 0.5)
    # a slow stage sets the pace: the first microbatch crosses every stage, then one leaves every 3 units
    assert predicted_step_s(make_schedule("gpipe", 2, 4, training=False), [1, 3], 0) == 1 + 4 * 3
    assert predicted_step_s(make_schedule("gpipe", 4, 8, training=False), [1, 1, 2, 1], 0) == 5 + 7 * 2
    # each message that crosses a stage boundary on the critical path adds its latency
    assert predicted_step_s(make_schedule("gpipe", 3, 2, training=False), 1, 0, hop_s=Fraction(1, 2)) == 4 + 1
    with pytest.raises(ValueError, match=r"forward_s needs one entry per stage \(4\), got 2"):
        simulate(make_schedule("gpipe", 4, 2), [1, 2])
    with pytest.raises(ValueError, match=r"forward_s \(seconds per op\) must be a number of at least 0, got -1"):
        simulate(make_schedule("gpipe", 2, 2), -1)


def test_messages_per_step():
    assert messages_per_step(make_schedule("gpipe", 4, 8)) == 2 * 3 * 8  # each boundary, both ways
    assert messages_per_step(make_schedule("1f1b", 4, 8, training=False)) == 3 * 8
    assert messages_per_step(make_schedule("interleaved-1f1b", 4, 8, n_chunks=2)) == 2 * (4 * 2 - 1) * 8
    assert messages_per_step(make_schedule("gpipe", 1, 8)) == 0
    s = make_schedule("1f1b", 3, 4)
    assert [a.label for a in s.messages(1, 2)] == ["F0", "F1", "F2", "F3"]
    assert [a.label for a in s.messages(2, 1)] == ["B0", "B1", "B2", "B3"]


def test_check_schedule_catches_broken_lists():
    good = make_schedule("1f1b", 2, 2)
    rows = [list(r) for r in good.actions]

    def broken(rows, training=True):
        return Schedule("1f1b", 2, 2, training, 1, tuple(tuple(r) for r in rows))

    with pytest.raises(ValueError, match="1 actions never run: stage 1 B1"):
        check_schedule(broken([rows[0], rows[1][:-1]]))
    with pytest.raises(ValueError, match="stage 0 runs F0 twice"):
        check_schedule(broken([rows[0] + [Action(0, 0, "F")], rows[1]]))
    with pytest.raises(ValueError, match="stage 1's list holds F0 of stage 0"):
        check_schedule(broken([rows[0], [Action(0, 0, "F")] + rows[1]]))
    with pytest.raises(ValueError, match="not part of this step"):
        check_schedule(broken([[Action(0, 5, "F")] + rows[0], rows[1]]))
    with pytest.raises(ValueError, match="not part of this step .*forward only"):
        check_schedule(broken([rows[0], rows[1]], training=False))
    # stage 0 insists on B0 before its own F0: it waits for a gradient that needs that very forward
    swapped = [[Action(0, 0, "B"), Action(0, 0, "F"), Action(0, 1, "F"), Action(0, 1, "B")], rows[1]]
    with pytest.raises(ValueError, match="deadlocks: stage 0 waits at B0 for B0 of stage 1; stage 1 waits at F0"):
        check_schedule(broken(swapped))
    with pytest.raises(ValueError, match="op is 'F' \\(forward\\), 'B' \\(backward\\) or 'W' \\(weight gradient\\)"):
        Action(0, 0, "X")


# -- measuring from a timeline -----------------------------------------------------------------------------
def _span(rank, op, mb, start, end):
    return Span(rank, f"{op}{mb}", "compute", start, end, {"op": op, "microbatch": mb, "chunk": 0})


def test_measured_idle_fraction_definition():
    # rank 0 busy [0, 1], rank 1 busy [1, 2]: window 2, busy 2 of 4 rank-seconds
    spans = [_span(0, "F", 0, 0.0, 1.0), _span(1, "F", 0, 1.0, 2.0),
             Span(1, "wait", "wait", 0.0, 1.0), Span(0, "send", "comm", 1.0, 1.1)]
    b = measure_bubble(spans, 2)
    assert (b.window_s, b.busy_s, b.idle_fraction) == (2.0, (1.0, 1.0), 0.5)
    # spans laid out exactly as the schedule predicts give exactly the formula
    for s in (make_schedule("gpipe", 4, 8), make_schedule("1f1b", 3, 5), make_schedule("gpipe", 2, 16, False)):
        perfect = [_span(t.action.stage, t.action.op, t.action.microbatch, float(t.start_s), float(t.end_s))
                   for t in simulate(s)]
        assert measure_bubble(perfect, s.n_stages).idle_fraction == pytest.approx(
            pipeline_bubble_fraction(s.n_stages, s.n_microbatches))
        assert measured_in_flight(perfect, s.n_stages) == peak_in_flight(s)
    with pytest.raises(ValueError, match="no pipeline compute spans"):
        measure_bubble([Span(0, "wait", "wait", 0.0, 1.0)], 1)
    with pytest.raises(ValueError, match=r"spans from ranks \[3\] do not belong to a 2-stage pipeline"):
        measure_bubble([_span(3, "F", 0, 0.0, 1.0)], 2)


def test_figures_draw_exactly_the_schedule():
    from shardlib.ui.pipeline_figures import bubble_curve_figure, in_flight_figure, step_through_figure

    s = make_schedule("1f1b", 4, 8)
    last = step_through_figure(s).frames[-1].data  # the schedule played to its last slot
    labels = [(y, t) for trace in last for y, t in zip(trace.y, trace.text)]
    assert sorted(labels) == sorted((f"stage {a.stage}", a.label) for row in s.actions for a in row)
    ends = [b + x for trace in last for b, x in zip(trace.base, trace.x)]
    assert max(ends) == step_slots(s)
    curve = bubble_curve_figure((2, 4), max_microbatches=16, measured={4: {8: 0.3}}, highlight=(4, 8))
    assert [t.name for t in curve.data] == ["p = 2: formula", "p = 4: formula", "p = 4: measured", "now"]
    assert curve.data[1].y[7] == pytest.approx(3 / 11)
    bars = in_flight_figure({"GPipe": (8, 8), "1F1B": (2, 1)})
    assert [list(t.y) for t in bars.data] == [[8, 8], [2, 1]]


def test_trips_and_departures_read_from_a_forward_only_timeline():
    # 2 stages, 3 microbatches, every forward 1 s and no hops: microbatch i runs [i, i+1] on stage 0 and
    # [i+1, i+2] on stage 1. Each trip is 2 s (both stages in turn); they leave 1 s apart.
    spans = [Span(stage, f"F{i}", "compute", i + stage, i + stage + 1, {"op": "F", "microbatch": i})
             for stage in (0, 1) for i in range(3)]
    trips = microbatch_trips(spans, 2)
    assert trips.trip_s == (2, 2, 2) and trips.gap_s == (1, 1)
    with pytest.raises(ValueError, match="stage 0 and on stage 3"):
        microbatch_trips(spans, 4)
