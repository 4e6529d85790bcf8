"""The microbatch slider: move ``m`` and the bubble curve answers at once, then the pipeline re-runs on
the warm ranks and its measured Gantt chart is drawn under the schedule's prediction."""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.core.pipeline.registry import SPECS, SPLIT_SCHEDULES, make_schedule
from shardlib.lab.pipeline.step import run_pipeline
from shardlib.predict.bubbles import BUBBLES, OpCosts, published_fraction, simulated_fraction
from shardlib.predict.pipeline import pipeline_bubble_fraction, predicted_step_s
from shardlib.ui.live import FigureArea, slider, wire
from shardlib.ui.pipeline_figures import bubble_curve_figure, predicted_vs_measured_figure
from shardlib.ui.theme import RED

# one chunk, whole backward: GPipe and 1F1B, the pair a training step compares against the bubble formula
EXPLORER_SCHEDULES = tuple(n for n, spec in SPECS.items() if spec.chunks == 1 and not spec.split_backward)


def microbatch_explorer(ranks, model, layers, x, grad_output=None, forward_s: float = 0.02, backward_s: float = 0.02,
                        max_microbatches: int = 16) -> widgets.VBox:
    """A slider for ``m`` (1 up to ``max_microbatches``, never more than the batch has rows); one step per move
    on ``ranks`` (``p = ranks.world_size`` stages), each forward padded to ``forward_s`` seconds. Without
    ``grad_output`` each step is a forward-only pass, as a server runs it (GPipe's list; 1F1B's is the same
    forward only). With it, each step trains, each backward padded to ``backward_s``, and buttons pick GPipe or
    1F1B."""
    p = ranks.world_size
    training = grad_output is not None
    top = max(1, min(int(max_microbatches), x.shape[0]))
    m_slider = widgets.IntSlider(value=min(4, top), min=1, max=top, description="microbatches m",
                                 continuous_update=False, style={"description_width": "initial"})
    picker = widgets.ToggleButtons(options=[(SPECS[n].title, n) for n in EXPLORER_SCHEDULES],
                                   value=EXPLORER_SCHEDULES[0], description="schedule")
    label = widgets.HTML()
    measured_at: dict[int, float] = {}
    curve, gantt = FigureArea(), FigureArea()

    def draw_curve() -> None:
        fig = bubble_curve_figure((p,), max_microbatches=top, highlight=(p, m_slider.value),
                                  timing_note=f"red circles measured on {ranks.description}")
        xs = sorted(measured_at)
        fig.add_scatter(x=xs, y=[measured_at[k] for k in xs], mode="markers", name="measured with the slider",
                        marker={"color": RED, "size": 9, "symbol": "circle-open", "line": {"width": 2}})
        curve.show(fig)

    def rerun(change=None) -> None:
        draw_curve()  # the formula answers at once; the ranks take a moment
        m = m_slider.value
        schedule = make_schedule(picker.value, p, m, training=training)
        run = run_pipeline(ranks, schedule, model, layers, x, grad_output, forward_s=forward_s,
                           backward_s=backward_s if training else None)
        bubble = run.bubble
        predicted = pipeline_bubble_fraction(p, m)
        if picker.value == EXPLORER_SCHEDULES[0]:
            measured_at[m] = bubble.idle_fraction
            draw_curve()
        step_s = predicted_step_s(schedule, forward_s, backward_s if training else 0)
        held = f"; peak microbatches in flight per stage {list(run.peak_in_flight)}" if training else ""
        label.value = (
            f"<b>{html.escape(schedule.title)}</b><br>idle fraction: predicted {predicted:.3f}, measured "
            f"{bubble.idle_fraction:.3f} (ratio {bubble.idle_fraction / predicted if predicted else float('nan'):.2f})"
            f"<br>step: predicted {step_s * 1e3:.0f} ms, measured {bubble.window_s * 1e3:.0f} ms{held}"
            f"<br><i>red circles: {'GPipe ' if training else ''}measurements made with this slider</i>"
        )
        gantt.show(predicted_vs_measured_figure(run, ranks.description))

    errors = wire([m_slider, picker] if training else [m_slider], rerun)
    return widgets.VBox([widgets.HBox([m_slider, picker] if training else [m_slider]), label, curve, gantt, errors])


ZERO_BUBBLE_SCHEDULES = ("1f1b",) + SPLIT_SCHEDULES  # 1F1B beside every schedule with the backward split
W_COSTS = (0.25, 0.5, 1.0, 1.5, 2.0)  # W's time as a multiple of F's (and B's)


def zero_bubble_explorer(ranks, model, layers, x, grad_output, op_s: float = 0.02,
                         microbatches=(4, 6, 8, 12, 16)) -> widgets.VBox:
    """Sliders for ``m`` (each of ``microbatches`` that every schedule here can run: at least ``2 p`` for
    DualPipeV, as the registry's specs say) and for W's cost (``W_COSTS`` times ``op_s``), buttons for the
    schedule; one step per move on ``ranks``, each stage's F and B padded to ``op_s`` seconds."""
    p = ranks.world_size
    options = [m for m in microbatches if m <= x.shape[0]
               and not any(SPECS[n].problems(p, m, 1, True) for n in ZERO_BUBBLE_SCHEDULES)]
    if not options:
        raise ValueError(f"need microbatch counts that every schedule here runs ({', '.join(ZERO_BUBBLE_SCHEDULES)}: "
                         f"from 2 p = {2 * p} for DualPipeV) up to the batch's {x.shape[0]} rows; got {microbatches}")
    m_slider = slider(options, options[0], "microbatches m")
    w_slider = slider([(f"{w:g} x F", w) for w in W_COSTS], 1.0, "W costs")
    picker = widgets.ToggleButtons(options=[(SPECS[n].title, n) for n in ZERO_BUBBLE_SCHEDULES], value="zb-h1",
                                   description="schedule")
    label, gantt = widgets.HTML(), FigureArea()

    def rerun(change=None) -> None:
        schedule = make_schedule(picker.value, p, m_slider.value)
        weight_s = op_s * w_slider.value
        run = run_pipeline(ranks, schedule, model, layers, x, grad_output, op_s, op_s, weight_s=weight_s)
        v = schedule.n_chunks
        costs = OpCosts(op_s / v, op_s / v, weight_s / v)  # the pads, per action
        measured = run.bubble.idle_fraction
        try:
            bubble = BUBBLES[picker.value]
            name = ("published formula" if bubble.window_idle is None else "published formula, its ramp kept for "
                    "one step" if bubble.qi_idle is not None else "no published formula; this course's one-step count")
            formula = f"{name} {published_fraction(schedule, costs):.3f}, "
        except ValueError:  # ZB-V's published claim holds only for F = B = W
            formula = "no published figure for W != F, "
        label.value = (f"<b>{html.escape(schedule.title)}</b>, W = {w_slider.value:g} x F: idle fraction "
                       f"{formula}this list {simulated_fraction(schedule, costs):.3f}, measured {measured:.3f}; "
                       f"peak chunks in flight per stage {list(run.peak_in_flight)}")
        gantt.show(predicted_vs_measured_figure(run, ranks.description, f"{schedule.title}: each stage's F and B "
                                                f"padded to {op_s * 1e3:g} ms, W to {weight_s * 1e3:g} ms"))

    errors = wire([m_slider, w_slider, picker], rerun)
    return widgets.VBox([widgets.HBox([m_slider, w_slider]), picker, label, gantt, errors])
