"""Plotly figures for the schedules past 1F1B: F, B and W as bars, predicted above measured.

The same rows and colours as ``pipeline_figures`` (one row per stage, coloured by microbatch), with three
kinds of bar: forward plain, B (the input gradient, or the whole backward when the schedule has no W)
hatched one way, W hatched the other; a chunk-1 action is labelled ``F3.1``. Pure: no torch.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..pipeline.bubbles import OpCosts, simulated_fraction
from ..pipeline.schedules import Schedule, simulate
from ..runtime.timeline import Span
from .gantt import Bar, bar_traces, row_axis
from .theme import colour

_STYLE = {"F": ("forward F", ""), "B": ("backward B", "/"), "W": ("weight gradient W", "x")}


def _bar(stage: int, start_ms: float, end_ms: float, label: str, op: str, microbatch: int, split: bool) -> Bar:
    group, pattern = _STYLE[op]
    if op == "B" and not split:
        group = "whole backward B (input and weights)"
    return Bar(f"stage {stage}", start_ms, end_ms, label, group, colour(microbatch), pattern)


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
