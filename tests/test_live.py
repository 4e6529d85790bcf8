"""Widgets never die silently: a failing callback writes, under the widget, what happened and what to do."""

import pytest

from shardlib import Ranks
from shardlib.runtime import PoolClosedError, RankError, RankTimeoutError
from shardlib.ui.live import Feedback, explain


@pytest.mark.parametrize("exc, words", [
    (PoolClosedError("closed"), "Run the cell that starts them (Ranks(...)) again"),
    (RankTimeoutError("the call did not finish within timeout=5 s\nmore", 0, [1]),
     "The ranks did not answer in time (the call did not finish within timeout=5 s). The pool restarted itself"),
    (RankError("rank 1 raised ValueError: bad\n\nTraceback ...", 1), "A rank failed: rank 1 raised ValueError: bad."),
    (ValueError("8 KV heads cannot be split 16 ways"), "That setting cannot run: 8 KV heads cannot be split 16 ways"),
    (KeyError("x"), "Something went wrong (KeyError)"),
])
def test_each_failure_is_explained_in_the_learners_terms(exc, words):
    assert words in explain(exc)


def test_the_guard_shows_the_error_and_clears_it_when_the_next_move_works():
    feedback = Feedback()
    calls = []

    def callback(change=None):
        calls.append(change)
        if change == "bad":
            raise ValueError("tp = 3 does not divide 8 KV heads")

    guarded = feedback.guard(callback)
    guarded("bad")  # does not raise: the learner reads it under the widget
    assert "That setting cannot run: tp = 3 does not divide 8 KV heads" in feedback.area.value
    assert isinstance(feedback.last_error, ValueError)
    guarded("good")
    assert feedback.area.value == "" and feedback.last_error is None and calls == ["bad", "good"]


def test_a_widget_on_a_closed_pool_says_so_instead_of_going_quiet():
    from shardlib.ui.intro_widgets import all_reduce_explorer

    ranks = Ranks(2)
    slider, label, fig, feedback = all_reduce_explorer(ranks).children
    before = label.value
    ranks.close()
    slider.value = slider.value + 1  # the callback runs on a closed pool
    assert "have been closed" in feedback.value and label.value == before


def test_the_selection_slider_keeps_its_value_when_the_frontend_sends_no_index():
    """Pressed past its last option, the frontend sends ``index: None``: the stock widget raises a
    TraitError (into the log console); ours keeps its value and its callbacks never see a change."""
    import ipywidgets

    from shardlib.ui.live import SelectionSlider

    stock = ipywidgets.SelectionSlider(options=[1, 2, 4], value=4)
    with pytest.raises(Exception, match="index"):
        stock.set_state({"index": None})
    safe = SelectionSlider(options=[1, 2, 4], value=4)
    seen = []
    safe.observe(lambda change: seen.append(change["new"]), names="value")
    safe.set_state({"index": None})
    assert (safe.value, safe.index, seen) == (4, 2, [])
    safe.set_state({"index": 0})
    assert (safe.value, seen) == (1, [1])
