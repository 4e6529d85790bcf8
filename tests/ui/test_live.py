"""Widgets never die silently: a failing callback writes, under the widget, what happened and what to do."""

import os

import pytest

from shardlib.runtime.errors import PoolClosedError, RankError, RankTimeoutError
from shardlib.runtime.ranks import Ranks
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


def test_a_slider_option_is_never_none():
    """ipywidgets reads a ``None`` value as 'nothing selected': taken to such an option, the stock slider
    raises a TraitError (into the log console, where no learner looks). Ours refuses the option up front."""
    import ipywidgets
    from traitlets import TraitError

    from shardlib.ui.live import SelectionSlider

    stock = ipywidgets.SelectionSlider(options=(("1 KiB", 1024), ("one bucket", None)), value=1024)
    with pytest.raises(TraitError, match="'index' trait .* expected an int, not the NoneType"):
        stock.set_state({"index": 1})
    with pytest.raises(ValueError, match="'one bucket' has the value None"):
        SelectionSlider(options=(("1 KiB", 1024), ("one bucket", None)), value=1024)
    safe = SelectionSlider(options=(("1 KiB", 1024), ("one bucket", 0)), value=1024)
    safe.set_state({"index": 1})
    assert (safe.value, safe.label) == (0, "one bucket")


def test_a_figure_area_writes_its_figure_from_the_kernel_and_shows_statically():
    """In a real kernel, ``show`` writes the figure into the widget's outputs from the kernel side (nothing
    captured: no display message a notebook runner would echo back on the shell channel), each figure in
    place of the last; the static page draws the last figure shown."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        seen = []
        code = ("import plotly.graph_objects as go\nfrom shardlib.ui.live import FigureArea\n"
                "from shardlib.ui import static\narea = FigureArea()\n"
                "for y in (1, 2):\n    area.show(go.Figure(go.Bar(y=[y]), layout={'title': f'y {y}'}))\n"
                "(out,) = area.outputs\n"
                "print(len(area.outputs), out['data']['application/vnd.plotly.v1+json']['data'][0]['y'], "
                "out['data']['text/plain'], 'plotly-graph-div' in static.widget_html(area))")
        reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: seen.append(msg))
        assert reply["content"]["status"] == "ok", reply["content"]
        printed = "".join(m["content"].get("text", "") for m in seen if m["msg_type"] == "stream")
        assert printed.split() == ["1", "[2]", "<y", "2>", "True"]
        assert not [m for m in seen if m["msg_type"] == "display_data"]  # nothing captured
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
