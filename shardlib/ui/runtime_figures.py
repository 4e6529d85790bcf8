"""Figures any notebook draws of its ranks: what each rank did when, measured points beside a curve.
Data in, ``go.Figure`` out."""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from shardlib.runtime.timeline import Span, shift_to_zero
from shardlib.ui.gantt import Bar, gantt_figure, titled
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import KIND_COLOURS, TEAL


@mime_figure
def timeline_figure(spans: Sequence[Span], origin_s: float | None = None,
                    title: str = "What each rank did", where: str = "") -> go.Figure:
    """A Gantt chart: one row per rank, one bar per span, coloured by kind, time in milliseconds.

    ``origin_s`` is the time zero (for example ``ranks.last_started_s``); by default the earliest span.
    ``where``: the ranks it was measured on (``ranks.description``), shown under the title.
    """
    if not spans:
        raise ValueError("no spans to draw: run a rank function that records some first")
    spans = shift_to_zero(list(spans), origin_s)
    bars = [Bar(f"rank {s.rank}", s.start_s * 1e3, s.end_s * 1e3, s.name, s.kind, KIND_COLOURS.get(s.kind, TEAL))
            for s in sorted(spans, key=lambda s: s.kind)]
    return gantt_figure(bars, [f"rank {r}" for r in sorted({s.rank for s in spans})], title, where=where)


@mime_figure
def measured_points_figure(x: Sequence[float], y: Sequence[float], x_title: str, y_title: str, title: str,
                           log_x: bool = True, where: str = "") -> go.Figure:
    """A scatter of measured points (for example all-reduce time against message size), ``where`` they
    were measured under the title."""
    fig = go.Figure(go.Scatter(x=list(x), y=list(y), mode="markers+lines", name="measured"))
    fig.update_layout(title=titled(title, where), xaxis_title=x_title, yaxis_title=y_title, height=340,
                      xaxis_type="log" if log_x else "linear")
    return fig
