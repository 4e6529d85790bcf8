"""The schedule registry: every spec builds what it says, refuses what it says, and its published facts
(the bubble in both notations, the peak in flight) agree with its own list played out by ``simulate``.

All on paper (exact slot arithmetic): each spec is checked the same way, so a new schedule is held to
these claims by adding its spec.
"""

from fractions import Fraction

import pytest

from shardlib.core.pipeline.registry import SCHEDULES, SPECS, ScheduleSpec, make_schedule, schedule_spec
from shardlib.core.pipeline.schedules import Schedule, simulate
from shardlib.predict.bubbles import BUBBLES, OpCosts, published_idle_s
from shardlib.predict.pipeline import peak_in_flight

# DualPipe's formula counts F&B as overlapped; this package runs each pair's F and B in turn and its list
# idles less than the formula: the formula is a bound for it, not its value
BOUND_ONLY = {"dualpipev"}
# formulas that hold for any F, B and W (ZB-H1's while W is no dearer than F or B)
ANY_COSTS = {"gpipe": None, "1f1b": None, "interleaved-1f1b": None, "zb-h1": "W <= F, B"}
COSTS = ((1, 1, 1), (2, 3, 1), (3, 2, 2), (1, 1, Fraction(1, 2)), (2, 2, 1))


def _chunk_counts(spec):
    return (2, 3) if spec.chunks is None else (1,)


def _runs(spec, p, m, v, training=True):
    return not spec.problems(p, m, v, training)


def _window_idle(schedule, f, b, w):
    """Idle per device over one step's window, F, B and W one action's times (a stage's op is v of them)."""
    v = schedule.n_chunks
    step = max(t.end_s for t in simulate(schedule, f * v, b * v, 0, w * v))
    return step - schedule.n_microbatches * v * (f + b + w)


def test_the_names_and_titles_are_the_registrys():
    assert SCHEDULES == tuple(SPECS)
    assert tuple(BUBBLES) == SCHEDULES  # every schedule's published bubble, or its one-step count
    assert {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev"} <= set(SCHEDULES)
    with pytest.raises(ValueError, match="no pipeline schedule called 'interleaved'; the schedules are 'gpipe'"):
        schedule_spec("interleaved")
    with pytest.raises(ValueError, match="no pipeline schedule called 'zb'"):
        make_schedule("zb", 2, 4)


@pytest.mark.parametrize("name", SCHEDULES)
def test_each_spec_builds_what_it_says_and_refuses_the_rest(name):
    spec = SPECS[name]
    for p in (1, 2, 3, 4):
        for m in range(1, 4 * p + 2):
            for v in _chunk_counts(spec):
                for training in (True, False):
                    problems = spec.problems(p, m, v, training)
                    if problems:
                        with pytest.raises(ValueError) as caught:
                            make_schedule(name, p, m, training, n_chunks=v)
                        assert str(caught.value) == "\n".join(problems)
                        continue
                    s = make_schedule(name, p, m, training, n_chunks=v)  # checked as it is built
                    assert (s.name, s.n_chunks, s.placement) == (name, spec.n_chunks(v), spec.placement)
                    assert s.split_backward == (spec.split_backward and training)
                    assert s.short_title == spec.title
    assert spec.training_only == bool(spec.problems(4, 8, _chunk_counts(spec)[0], False))


def test_the_preconditions_are_said_in_words():
    cases = [(("interleaved-1f1b", 2, 3, True, 2), "n_microbatches must be a multiple of 2; got 3"),
             (("interleaved-1f1b", 2, 4, True, 1), "needs at least 2 model chunks per device, got n_chunks = 1"),
             (("1f1b", 2, 4, True, 2), "1F1B gives each device one model chunk; n_chunks = 2 needs 'interleaved-1f1b'"),
             (("zb-h1", 2, 4, False, 1), "forward only, it is plain 1F1B"),
             (("dualpipev", 4, 7, True, 1), "DualPipeV needs at least 2 n_stages = 8 microbatches"),
             (("zb-v", 2, 4, True, 3), "ZB-V gives each device 2 model chunks; got n_chunks = 3")]
    for (name, p, m, training, v), words in cases:
        with pytest.raises(ValueError, match=words):
            make_schedule(name, p, m, training, n_chunks=v)


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_published_bubble_is_the_lists_own_at_equal_costs(name):
    """F = B = W, one step's window: the list played out idles exactly what the registry's bubble says
    (DualPipeV's formula, for F&B overlapped, bounds this list from above)."""
    spec = SPECS[name]
    for p in (2, 3, 4):
        for m in (2 * p, 3 * p, 4 * p):
            for v in _chunk_counts(spec):
                if not _runs(spec, p, m, v):
                    continue
                s = make_schedule(name, p, m, n_chunks=v)
                idle, published = _window_idle(s, 1, 1, 1), published_idle_s(name, p, OpCosts(1, 1, 1))
                assert idle <= published if name in BOUND_ONLY else idle == published, (name, p, m, v, idle)


@pytest.mark.parametrize("name", sorted(ANY_COSTS))
def test_the_formulas_that_hold_for_any_costs_do(name):
    spec = SPECS[name]
    for f, b, w in COSTS:
        if ANY_COSTS[name] and w > min(f, b):
            continue
        for p in (2, 4):
            for m in (p, 2 * p, 4 * p):
                for v in _chunk_counts(spec):
                    s = make_schedule(name, p, m, n_chunks=v)
                    assert _window_idle(s, f, b, w) == published_idle_s(name, p, OpCosts(f, b, w)), (p, m, v, f, b, w)


@pytest.mark.parametrize("name", [n for n in SCHEDULES if BUBBLES[n].qi_idle])
def test_both_notations_give_one_number(name):
    """Qi's B is the input gradient; DualPipe's README's B the whole backward, Qi's B + W."""
    bubble = BUBBLES[name]
    for p in (2, 4, 8):
        for f, b, w in COSTS:
            assert bubble.qi_idle(p, f, b, w) == bubble.dualpipe_idle(p, f, b + w, w), (p, f, b, w)
    assert bubble.qi and bubble.dualpipe and bubble.source


@pytest.mark.parametrize("name", SCHEDULES)
def test_the_peak_in_flight_is_the_papers(name):
    """The fullest stage's chunks held at once (F until its W, or its whole B), counted from the list,
    equal the peak the spec's source states (in microbatches or chunk-microbatches)."""
    spec = SPECS[name]
    assert spec.in_flight.source
    for p in (2, 4):
        for m in (4 * p, 6 * p):
            for v in _chunk_counts(spec):
                s = make_schedule(name, p, m, n_chunks=v)
                assert max(peak_in_flight(s)) == spec.in_flight.chunks(p, m, s.n_chunks), (p, m, v)


def test_a_specs_placement_is_checked_as_its_schedule_is_built():
    base = SPECS["zb-v"]
    fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
    rows = tuple(tuple(r) for r in base.order(2, 4, 2, True))
    for change, words in (({"placement": "w"}, "placement is 'loop' or 'v'"),  # checked as the schedule is built
                          ({"chunks": 3}, "the V placement gives each stage 2 chunks .* got n_chunks = 3")):
        spec = ScheduleSpec(**{**fields, **change})
        with pytest.raises(ValueError, match=words):
            Schedule(spec.name, 2, 4, True, spec.chunks, rows, spec.placement)
