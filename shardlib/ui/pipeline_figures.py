"""Plotly figures for pipeline parallelism: a schedule played slot by slot, a schedule's prediction above
the same step measured on real ranks, the bubble curve and the microbatches in flight. Data in,
``go.Figure`` out.

The prediction and the measurement draw the same things the same way (one row per stage, one bar per
F, B or W, coloured by microbatch, B hatched, W crossed), so they can be read against each other. Pure:
no torch, no processes.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlib.core.pipeline.schedules import Schedule, TimedAction, simulate
from shardlib.predict.bubbles import OpCosts, simulated_fraction
from shardlib.predict.pipeline import compute_spans, pipeline_bubble_fraction, pipeline_bubble_ratio_to_ideal
from shardlib.runtime.timeline import Span
from shardlib.ui.gantt import Bar, bar_traces, row_axis
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import WAIT_COLOUR, colour

# legend entry and hatching of each op; without W actions a B is the whole backward
_OP_STYLE = {"F": ("forward F", ""), "B": ("backward B", "/"), "W": ("weight gradient W", "x")}
WHOLE_BACKWARD = "whole backward B (input and weights)"


def _stage_axis(n_stages: int) -> dict:
    return row_axis([f"stage {s}" for s in range(n_stages)])


def _op_bar(stage: int, start: float, end: float, label: str, op: str, microbatch: int, split: bool) -> Bar:
    group, pattern = _OP_STYLE[op]
    return Bar(f"stage {stage}", start, end, label, group if op != "B" or split else WHOLE_BACKWARD,
               colour(microbatch), pattern)


def schedule_traces(schedule: Schedule, timed: Sequence[TimedAction], scale: float = 1.0, show_legend: bool = True):
    """The schedule's actions as bars, ``scale`` turning its times into the axis unit (1: slots, 1e3: ms)."""
    bars = [_op_bar(t.action.stage, float(t.start_s) * scale, float(t.end_s) * scale, t.action.label, t.action.op,
                    t.action.microbatch, schedule.split_backward) for t in timed]
    return bar_traces(bars, show_legend, "slots" if scale == 1.0 else "ms")


def measured_traces(spans: Sequence[Span], split: bool, show_legend: bool = True):
    """A real run's actions as bars, in ms from the first action, and thin grey waits under them."""
    work = compute_spans(spans)
    if not work:
        raise ValueError("no pipeline compute spans to draw: run a pipeline step on the ranks first")
    origin = min(s.start_s for s in work)
    bars = [_op_bar(s.rank, (s.start_s - origin) * 1e3, (s.end_s - origin) * 1e3, s.name, s.attrs["op"],
                    s.attrs["microbatch"], split) for s in work]
    waits = [Bar(f"stage {s.rank}", (s.start_s - origin) * 1e3, (s.end_s - origin) * 1e3, "waiting",
                 "waiting for a message", WAIT_COLOUR) for s in spans if s.kind == "wait" and "source" in s.attrs]
    return (bar_traces(waits, show_legend, width=0.25) if waits else []) + bar_traces(bars, show_legend)


def _ms(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v * 1e3:g} ms" for v in value) + "]"
    return f"{value * 1e3:g} ms"


@mime_figure
def predicted_vs_measured_figure(run, where: str = "", title: str | None = None) -> go.Figure:
    """A padded ``lab.pipeline.step.PipelineRun``: its schedule timed by ``simulate`` with the pads
    (top, a model) and the real run (bottom, waits in grey), on one time axis in ms. ``where`` says where
    the run was measured (``Ranks.description``)."""
    schedule, v = run.schedule, run.schedule.n_chunks
    if run.forward_s is None or (schedule.training and run.backward_s is None):
        raise ValueError("the prediction needs the pads: run the step with forward_s and backward_s set")
    if isinstance(run.forward_s, (list, tuple)) or isinstance(run.backward_s, (list, tuple)):
        raise ValueError("draw a run padded alike on every stage: one forward_s, one backward_s")
    backward_s = run.forward_s if run.backward_s is None else run.backward_s
    costs = OpCosts(run.forward_s / v, backward_s / v, (run.weight_s or 0) / v)  # one action's, in seconds
    timed = simulate(schedule, run.forward_s, backward_s, 0, run.weight_s)
    pads = f"forward {_ms(run.forward_s)}" + (f", backward {_ms(backward_s)}" if schedule.training else "")
    pads += f", weight gradient {_ms(run.weight_s)}" if run.weight_s is not None else ""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=(
        f"predicted by the schedule, a model (idle {simulated_fraction(schedule, costs):.1%})",
        f"measured on {schedule.n_stages} ranks, idle {run.bubble.idle_fraction:.1%}"
        + (f"<br>{where}" if where else "")))
    for trace in schedule_traces(schedule, timed, 1e3):
        fig.add_trace(trace, row=1, col=1)
    for trace in measured_traces(run.spans, schedule.split_backward, show_legend=False):
        fig.add_trace(trace, row=2, col=1)
    axis = _stage_axis(schedule.n_stages)
    fig.update_yaxes(**axis, row=1, col=1)
    fig.update_yaxes(**axis, row=2, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(title=title or f"{schedule.title}. Each op padded with sleep to a set duration ({pads})",
                      barmode="overlay", bargap=0.15, height=220 + 90 * schedule.n_stages,
                      margin={"l": 70, "r": 20, "t": 80, "b": 40}, title_font_size=13)
    return fig


@mime_figure
def bubble_curve_figure(n_stages: Sequence[int] = (2, 4, 8), max_microbatches: int = 32,
                        measured: Mapping[int, Mapping[int, float]] | None = None,
                        highlight: tuple[int, int] | None = None, timing_note: str = "") -> go.Figure:
    """The bubble fraction ``(p - 1) / (m + p - 1)`` against the number of microbatches ``m``, one
    line per ``p``; ``measured[p][m]`` (idle fractions from real runs) as markers; ``highlight = (p, m)``
    marks one point. Hover shows Megatron's ratio-to-ideal ``(p - 1) / m`` as well."""
    ms = list(range(1, max_microbatches + 1))
    fig = go.Figure()
    for i, p in enumerate(n_stages):
        line_colour = colour(i)
        fig.add_trace(go.Scatter(
            x=ms, y=[pipeline_bubble_fraction(p, m) for m in ms], mode="lines", name=f"p = {p}: formula",
            line={"color": line_colour}, customdata=[pipeline_bubble_ratio_to_ideal(p, m) for m in ms],
            hovertemplate=("m = %{x}: idle fraction %{y:.3f} (ratio to ideal %{customdata:.3f})"
                           f"<extra>p = {p}</extra>"),
        ))
        if measured and p in measured:
            pts = sorted(measured[p].items())
            fig.add_trace(go.Scatter(
                x=[m for m, _ in pts], y=[f for _, f in pts], mode="markers", name=f"p = {p}: measured",
                marker={"color": line_colour, "size": 9, "symbol": "circle-open", "line": {"width": 2}},
                hovertemplate="m = %{x}: measured idle %{y:.3f}<extra>p = " + str(p) + "</extra>",
            ))
    if highlight is not None:
        p, m = highlight
        fig.add_trace(go.Scatter(x=[m], y=[pipeline_bubble_fraction(p, m)], mode="markers", name="now",
                                 marker={"color": "black", "size": 12, "symbol": "x"}))
    title = "The bubble: share of each device's step spent idle, (p - 1) / (m + p - 1) (lines: the formula, a model)"
    fig.update_layout(title=title + (f"<br><sub>{timing_note}</sub>" if timing_note else ""),
                      xaxis_title="microbatches per step, m", yaxis_title="idle fraction", yaxis_range=[0, 1],
                      height=380, margin={"l": 60, "r": 20, "t": 70, "b": 40})
    return fig


@mime_figure
def in_flight_figure(peaks: Mapping[str, Sequence[int]], activation_bytes: Mapping[str, Sequence[int]] | None = None,
                     title: str = "Microbatches in flight per stage (measured)") -> go.Figure:
    """Grouped bars: peak microbatches in flight on each stage, one group per schedule. With
    ``activation_bytes`` the hover shows the measured peak activation memory too."""
    fig = go.Figure()
    for i, (name, row) in enumerate(peaks.items()):
        extra = activation_bytes.get(name) if activation_bytes else None
        fig.add_trace(go.Bar(
            name=name, x=[f"stage {s}" for s in range(len(row))], y=list(row), marker_color=colour(i),
            text=list(row), textposition="outside",
            customdata=[b / 1024 for b in extra] if extra else None,
            hovertemplate=("%{y} in flight" + (", %{customdata:.0f} KiB of activations" if extra else "")
                           + "<extra>" + name + "</extra>"),
        ))
    fig.update_layout(title=title, barmode="group", yaxis_title="peak microbatches held", height=340,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig


@mime_figure
def step_through_figure(schedule: Schedule, title: str | None = None) -> go.Figure:
    """The schedule played slot by slot (every forward or backward one slot): press play, or drag the
    slider, and watch microbatches enter stage 0, move down the stages and (training) come back up;
    the empty cells that remain are the bubble."""
    v = schedule.n_chunks
    timed = simulate(schedule, forward_s=v, backward_s=v)
    n_slots = int(max(t.end_s for t in timed))
    names = [t.name for t in schedule_traces(schedule, timed)]

    def upto(k: int):
        return schedule_traces(schedule, [t for t in timed if t.start_s < k], 1.0)

    def padded(traces):
        # every frame needs the same traces, one per op, even when empty
        by_name = {t.name: t for t in traces}
        return [by_name.get(name, go.Bar(orientation="h", name=name, x=[], y=[], base=[])) for name in names]

    frames = [go.Frame(data=padded(upto(k)), name=str(k), traces=list(range(len(names))),
                       layout={"title": f"{title or schedule.title}: after slot {k} of {n_slots}"})
              for k in range(1, n_slots + 1)]
    # an invisible point per stage keeps every stage's row on the axis before its first bar arrives
    rows = go.Scatter(x=[0] * schedule.n_stages, y=[f"stage {s}" for s in range(schedule.n_stages)], mode="markers",
                      marker={"opacity": 0}, showlegend=False, hoverinfo="skip")
    fig = go.Figure(data=padded(upto(1)) + [rows], frames=frames)
    fig.update_layout(
        title=f"{title or schedule.title}: after slot 1 of {n_slots}", barmode="overlay", bargap=0.15,
        xaxis={"range": [0, n_slots], "title": "time (slots: one forward or backward each)"},
        yaxis=_stage_axis(schedule.n_stages), height=220 + 45 * schedule.n_stages,
        margin={"l": 70, "r": 20, "t": 50, "b": 40},
        updatemenus=[{"type": "buttons", "showactive": False, "x": 0, "y": -0.25, "xanchor": "left",
                      "buttons": [{"label": "play", "method": "animate",
                                   "args": [None, {"frame": {"duration": 400, "redraw": True}, "fromcurrent": True}]},
                                  {"label": "pause", "method": "animate",
                                   "args": [[None], {"frame": {"duration": 0}, "mode": "immediate"}]}]}],
        sliders=[{"active": 0, "x": 0.15, "len": 0.85, "y": -0.15, "currentvalue": {"prefix": "slot "},
                  "steps": [{"label": str(k), "method": "animate",
                             "args": [[str(k)], {"frame": {"duration": 0, "redraw": True}, "mode": "immediate"}]}
                            for k in range(1, n_slots + 1)]}],
    )
    return fig
