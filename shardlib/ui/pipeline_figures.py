"""Plotly figures for pipeline parallelism: a schedule's Gantt chart, the same chart measured on real
ranks, the two side by side, and the bubble curve. Data in, ``go.Figure`` out.

The schedule chart and the measured chart draw the same things the same way (one row per stage, one
bar per forward or backward, coloured by microbatch, backwards hatched), so they can be read against
each other. Pure: no torch, no processes.
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

# legend entry and hatching of each op
_OP_STYLE = {"F": ("forward", ""), "B": ("backward", "/"), "W": ("weight gradient", "x")}


def _stage_rows(n_stages: int) -> list[str]:
    return [f"stage {s}" for s in range(n_stages)]


def _stage_axis(n_stages: int) -> dict:
    return row_axis(_stage_rows(n_stages))


def _op_bar(stage: int, start: float, end: float, label: str, op: str, microbatch: int) -> Bar:
    group, pattern = _OP_STYLE[op]
    return Bar(f"stage {stage}", start, end, label, group, colour(microbatch), pattern)


def schedule_traces(schedule: Schedule, timed: Sequence[TimedAction], scale: float = 1.0, show_legend: bool = True):
    """The schedule's forwards and backwards as bars, ``scale`` turning its times into the axis unit."""
    unit = "slots" if scale == 1.0 else "ms"
    bars = [_op_bar(t.action.stage, float(t.start_s) * scale, float(t.end_s) * scale, t.action.label, t.action.op,
                    t.action.microbatch) for t in sorted(timed, key=lambda t: t.action.op, reverse=True)]
    return bar_traces(bars, show_legend, unit)


def measured_traces(spans: Sequence[Span], origin_s: float, show_waits: bool = True, show_legend: bool = True):
    """A real run's forwards and backwards as bars (ms from ``origin_s``), and thin grey waits."""
    work = sorted(compute_spans(spans), key=lambda s: s.attrs["op"], reverse=True)
    bars = [_op_bar(s.rank, (s.start_s - origin_s) * 1e3, (s.end_s - origin_s) * 1e3, s.name, s.attrs["op"],
                    s.attrs["microbatch"]) for s in work]
    waits = [Bar(f"stage {s.rank}", (s.start_s - origin_s) * 1e3, (s.end_s - origin_s) * 1e3, "waiting",
                 "waiting for a message", WAIT_COLOUR) for s in spans if s.kind == "wait"]
    if not show_waits or not waits:
        return bar_traces(bars, show_legend)
    return bar_traces(waits, show_legend, width=0.25) + bar_traces(bars, show_legend)


@mime_figure
def schedule_figure(schedule: Schedule, forward_s=1, backward_s=1, title: str | None = None) -> go.Figure:
    """The schedule's Gantt chart, as ``simulate`` times it. With the default durations (1 and 1) the
    x axis counts slots; give seconds and it is in milliseconds."""
    timed = simulate(schedule, forward_s, backward_s)
    slots = all(isinstance(v, int) for v in (forward_s, backward_s))
    fig = go.Figure(schedule_traces(schedule, timed, 1.0 if slots else 1e3))
    fig.update_layout(title=title or f"{schedule.title}: the schedule", barmode="overlay",
                      xaxis_title="time (slots: one forward or backward each)" if slots else "time (ms)",
                      yaxis=_stage_axis(schedule.n_stages), height=140 + 45 * schedule.n_stages,
                      margin={"l": 70, "r": 20, "t": 50, "b": 40}, bargap=0.15)
    return fig


@mime_figure
def measured_figure(spans: Sequence[Span], n_stages: int, title: str, show_waits: bool = True) -> go.Figure:
    """What each rank did in a real pipeline step: its forwards and backwards (and, thin and grey, the
    time it spent waiting for a message), time from the first compute span, in ms."""
    work = compute_spans(spans)
    if not work:
        raise ValueError("no pipeline compute spans to draw: run a pipeline step on the ranks first")
    origin = min(s.start_s for s in work)
    fig = go.Figure(measured_traces(spans, origin, show_waits))
    fig.update_layout(title=title, barmode="overlay", xaxis_title="time (ms)", yaxis=_stage_axis(n_stages),
                      height=140 + 45 * n_stages, margin={"l": 70, "r": 20, "t": 50, "b": 40}, bargap=0.15)
    return fig


def _ms(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(f"{v * 1e3:g} ms" for v in value) + "]"
    return f"{value * 1e3:g} ms"


@mime_figure
def predicted_vs_measured_figure(schedule: Schedule, spans: Sequence[Span], forward_s, backward_s,
                                 measured_idle: float | None = None, where: str = "") -> go.Figure:
    """The schedule's prediction (top, a model) and the real run (bottom), on one time axis in ms.

    ``forward_s`` / ``backward_s`` are the durations the prediction uses and the run's ops were padded to
    (a number, or one per stage); ``where`` says where the run was measured (``Ranks.description``)."""
    timed = simulate(schedule, forward_s, backward_s)
    work = compute_spans(spans)
    if not work:
        raise ValueError("no pipeline compute spans to draw: run a pipeline step on the ranks first")
    predicted = pipeline_bubble_fraction(schedule.n_stages, schedule.n_microbatches, schedule.n_chunks)
    measured = f", measured {measured_idle:.1%}" if measured_idle is not None else ""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(f"predicted by the schedule, a model (idle {predicted:.1%})",
                                        f"measured on {schedule.n_stages} ranks{measured}"
                                        + (f"<br>{where}" if where else "")))
    for trace in schedule_traces(schedule, timed, 1e3):
        fig.add_trace(trace, row=1, col=1)
    for trace in measured_traces(spans, min(s.start_s for s in work), show_legend=False):
        fig.add_trace(trace, row=2, col=1)
    axis = _stage_axis(schedule.n_stages)
    fig.update_yaxes(**axis, row=1, col=1)
    fig.update_yaxes(**axis, row=2, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(title=f"{schedule.title}. Each op padded with sleep to a set duration (forward "
                      f"{_ms(forward_s)}, backward {_ms(backward_s)})", barmode="overlay", bargap=0.15,
                      height=220 + 90 * schedule.n_stages, margin={"l": 70, "r": 20, "t": 80, "b": 40},
                      title_font_size=13)
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

    def upto(k: int):
        return schedule_traces(schedule, [t for t in timed if t.start_s < k], 1.0)

    def padded(traces):
        # every frame needs the same traces: a forward and a backward one, even when empty
        by_name = {t.name: t for t in traces}
        return [by_name.get(name, go.Bar(orientation="h", name=name, x=[], y=[], base=[]))
                for name in ("forward", "backward")]

    frames = [go.Frame(data=padded(upto(k)), name=str(k), traces=[0, 1],
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


_STYLE = {"F": ("forward F", ""), "B": ("backward B", "/"), "W": ("weight gradient W", "x")}


def _bar(stage: int, start_ms: float, end_ms: float, label: str, op: str, microbatch: int, split: bool) -> Bar:
    group, pattern = _STYLE[op]
    if op == "B" and not split:
        group = "whole backward B (input and weights)"
    return Bar(f"stage {stage}", start_ms, end_ms, label, group, colour(microbatch), pattern)


@mime_figure
def split_gantt_figure(schedule: Schedule, spans: Sequence[Span], costs: OpCosts, title: str,
                       measured_idle: float | None = None) -> go.Figure:
    """``schedule`` timed by ``simulate`` with ``costs`` (one action's F, B, W, seconds) on top, the real
    run's ``spans`` below, both in ms from the first action."""
    v = schedule.n_chunks
    timed = simulate(schedule, costs.forward_s * v, costs.backward_s * v, 0, costs.weight_s * v)
    split = schedule.split_backward
    predicted = [_bar(t.action.stage, float(t.start_s) * 1e3, float(t.end_s) * 1e3, t.action.label, t.action.op,
                      t.action.microbatch, split) for t in timed]
    work = [s for s in spans if s.kind == "compute" and s.attrs.get("op") in _STYLE]
    if not work:
        raise ValueError("no pipeline compute spans to draw: run a pipeline step on the ranks first")
    origin = min(s.start_s for s in work)
    measured = [_bar(s.rank, (s.start_s - origin) * 1e3, (s.end_s - origin) * 1e3, s.name, s.attrs["op"],
                     s.attrs["microbatch"], split) for s in work]
    said = f", measured {measured_idle:.1%}" if measured_idle is not None else ""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12,
                        subplot_titles=(f"predicted from the list (idle {simulated_fraction(schedule, costs):.1%})",
                                        f"measured on {schedule.n_stages} ranks{said}"))
    for trace in bar_traces(predicted, True):
        fig.add_trace(trace, row=1, col=1)
    for trace in bar_traces(measured, False):
        fig.add_trace(trace, row=2, col=1)
    axis = row_axis([f"stage {s}" for s in range(schedule.n_stages)])
    fig.update_yaxes(**axis, row=1, col=1)
    fig.update_yaxes(**axis, row=2, col=1)
    fig.update_xaxes(title_text="time (ms)", row=2, col=1)
    fig.update_layout(title=title, barmode="overlay", bargap=0.15, height=220 + 90 * schedule.n_stages,
                      margin={"l": 70, "r": 20, "t": 80, "b": 40}, title_font_size=13)
    return fig
