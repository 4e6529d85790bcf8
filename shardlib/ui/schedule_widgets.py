"""The zero-bubble slider: pick a schedule, the microbatch count and W's cost against F and B; the step
re-runs on the warm ranks and its Gantt chart is drawn under the prediction, with the bubble measured
beside the published formula and the list's own prediction."""

from __future__ import annotations

import html

import ipywidgets as widgets
from IPython.display import display

from ..pipeline.bubble_drivers import run_split_pipeline
from ..pipeline.bubbles import PUBLISHED, OpCosts, published_fraction, simulated_fraction
from ..pipeline.orders import make_schedule
from ..pipeline.schedules import SCHEDULE_TITLES
from .live import Feedback, SelectionSlider, observe_all
from .schedule_figures import split_gantt_figure

EXPLORER_SCHEDULES = ("1f1b", "zb-h1", "zb-v", "dualpipev")
W_COSTS = (0.25, 0.5, 1.0, 1.5, 2.0)  # W's time as a multiple of F's (and B's)


def zero_bubble_explorer(ranks, model, layers, x, grad_output, op_s: float = 0.02,
                         microbatches=(4, 6, 8, 12, 16)) -> widgets.VBox:
    """Sliders for ``m`` (each of ``microbatches`` at least ``2 p``, as DualPipeV needs) and for W's cost
    (``W_COSTS`` times ``op_s``), buttons for the schedule; one step per move on ``ranks``, each stage's F
    and B padded to ``op_s`` seconds."""
    p = ranks.world_size
    options = [m for m in microbatches if 2 * p <= m <= x.shape[0]]
    if not options:
        raise ValueError(f"need microbatch counts from 2 p = {2 * p} to the batch's {x.shape[0]} rows; "
                         f"got {microbatches}")
    m_slider = SelectionSlider(options=options, value=options[0], description="microbatches m",
                               continuous_update=False, style={"description_width": "initial"})
    w_slider = SelectionSlider(options=[(f"{w:g} x F", w) for w in W_COSTS], value=1.0, description="W costs",
                               continuous_update=False, style={"description_width": "initial"})
    picker = widgets.ToggleButtons(options=[(SCHEDULE_TITLES[n], n) for n in EXPLORER_SCHEDULES], value="zb-h1",
                                   description="schedule")
    label, gantt = widgets.HTML(), widgets.Output()

    def rerun(change=None) -> None:
        schedule = make_schedule(picker.value, p, m_slider.value)
        weight_s = op_s * w_slider.value
        run = run_split_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s, weight_s)
        v = schedule.n_chunks
        costs = OpCosts(op_s / v, op_s / v, weight_s / v)  # the pads, per action
        measured = run.bubble.idle_fraction
        formula = (f"published formula {published_fraction(schedule, costs):.3f}, " if picker.value in PUBLISHED
                   else "no published closed form, ")
        label.value = (f"<b>{html.escape(schedule.title)}</b>, W = {w_slider.value:g} x F: idle fraction "
                       f"{formula}this list {simulated_fraction(schedule, costs):.3f}, measured {measured:.3f}; "
                       f"peak chunks in flight per stage {list(run.peak_in_flight)}")
        with gantt:
            gantt.clear_output(wait=True)
            display(split_gantt_figure(schedule, run.spans, costs, f"{schedule.title}: each stage's F and B "
                                       f"padded to {op_s * 1e3:g} ms, W to {weight_s * 1e3:g} ms", measured))

    feedback = Feedback()
    observe_all([m_slider, w_slider, picker], rerun, feedback)
    rerun()
    return widgets.VBox([widgets.HBox([m_slider, w_slider]), picker, label, gantt, feedback.area])
