"""The microbatch slider: move ``m`` and the bubble curve answers at once, then the pipeline re-runs on
the warm ranks and its measured Gantt chart is drawn under the schedule's prediction."""

from __future__ import annotations

import html

import ipywidgets as widgets
import plotly.graph_objects as go
from IPython.display import display

from ..pipeline.drivers import run_pipeline
from ..pipeline.orders import make_schedule
from ..pipeline.predict import pipeline_bubble_fraction, predicted_step_s
from ..pipeline.schedules import SCHEDULE_TITLES
from .live import Feedback, observe_all
from .pipeline_figures import bubble_curve_figure, predicted_vs_measured_figure
from .theme import RED

EXPLORER_SCHEDULES = ("gpipe", "1f1b")


def microbatch_explorer(ranks, model, layers, x, grad_output, forward_s: float = 0.02, backward_s: float = 0.02,
                        max_microbatches: int = 16) -> widgets.VBox:
    """A slider for ``m`` (1 up to ``max_microbatches``, never more than the batch has rows), buttons
    for GPipe or 1F1B; one training step per move on ``ranks`` (``p = ranks.world_size`` stages), each
    forward and backward padded to ``forward_s`` / ``backward_s`` seconds."""
    p = ranks.world_size
    top = max(1, min(int(max_microbatches), x.shape[0]))
    slider = widgets.IntSlider(value=min(4, top), min=1, max=top, description="microbatches m",
                               continuous_update=False, style={"description_width": "initial"})
    picker = widgets.ToggleButtons(options=[(SCHEDULE_TITLES[n], n) for n in EXPLORER_SCHEDULES],
                                   value=EXPLORER_SCHEDULES[0], description="schedule")
    label = widgets.HTML()
    curve = go.FigureWidget(bubble_curve_figure((p,), max_microbatches=top, highlight=(p, slider.value),
                                                timing_note=f"red circles measured on {ranks.description}"))
    measured_at: dict[int, float] = {}
    curve.add_scatter(x=[], y=[], mode="markers", name="measured with the slider",
                      marker={"color": RED, "size": 9, "symbol": "circle-open", "line": {"width": 2}})
    gantt = widgets.Output()

    def move_marker() -> None:
        m = slider.value
        with curve.batch_update():
            now = next(t for t in curve.data if t.name == "now")
            now.x, now.y = [m], [pipeline_bubble_fraction(p, m)]

    def rerun(change=None) -> None:
        move_marker()  # the formula answers at once; the ranks take a moment
        m = slider.value
        schedule = make_schedule(picker.value, p, m, training=True)
        run = run_pipeline(ranks, schedule, model, layers, x, grad_output, forward_s=forward_s, backward_s=backward_s)
        bubble = run.bubble
        predicted = pipeline_bubble_fraction(p, m)
        if picker.value == EXPLORER_SCHEDULES[0]:
            measured_at[m] = bubble.idle_fraction
        with curve.batch_update():
            dots = next(t for t in curve.data if t.name == "measured with the slider")
            xs = sorted(measured_at)
            dots.x, dots.y = xs, [measured_at[k] for k in xs]
        step_s = predicted_step_s(schedule, forward_s, backward_s)
        label.value = (
            f"<b>{html.escape(schedule.title)}</b><br>idle fraction: predicted {predicted:.3f}, measured "
            f"{bubble.idle_fraction:.3f} (ratio {bubble.idle_fraction / predicted if predicted else float('nan'):.2f})"
            f"<br>step: predicted {step_s * 1e3:.0f} ms, measured {bubble.window_s * 1e3:.0f} ms; peak microbatches "
            f"in flight per stage {list(run.peak_in_flight)}; this re-run took {run.wall_s * 1e3:.0f} ms"
            "<br><i>red circles: GPipe measurements made with this slider</i>"
        )
        with gantt:
            gantt.clear_output(wait=True)
            display(predicted_vs_measured_figure(schedule, run.spans, forward_s, backward_s, run.timing_note,
                                                 bubble.idle_fraction, ranks.description))

    feedback = Feedback()
    observe_all([slider, picker], rerun, feedback)
    rerun()
    return widgets.VBox([widgets.HBox([slider, picker]), label, curve, gantt, feedback.area])
