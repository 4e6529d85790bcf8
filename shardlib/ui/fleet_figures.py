"""Serving at scale's figures: SLO attainment over the request rate (where goodput is read), and the
requests each replica was sent. Plotly only: data in, a figure out."""

from __future__ import annotations

import plotly.graph_objects as go

from shardlib.ui.gantt import titled
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import colour


@mime_figure
def attainment_figure(curves: dict, share: float, title: str = "Requests meeting both objectives",
                      where: str = "") -> go.Figure:
    """``curves``: label -> ((rate per engine, share meeting the objectives), ...); ``share``: the
    objective's (0.9 in DistServe), drawn as a line: goodput is the last rate above it."""
    if not curves:
        raise ValueError("no configuration to draw: give at least one curve")
    traces = [go.Scatter(x=[r for r, _ in points], y=[s * 100 for _, s in points], mode="lines+markers",
                         name=label, line={"color": colour(i)},
                         hovertemplate=label + ": %{y:.0f} % at %{x:.1f} requests/s per engine<extra></extra>")
              for i, (label, points) in enumerate(curves.items())]
    xs = [r for points in curves.values() for r, _ in points]
    traces.append(go.Scatter(x=[min(xs), max(xs)], y=[share * 100] * 2, mode="lines", name="the objective's share",
                             line={"color": "grey", "dash": "dash"}, hoverinfo="skip"))
    fig = go.Figure(traces)
    fig.update_layout(title=titled(title, where), xaxis_title="request rate per engine (requests/s, log scale)",
                      xaxis_type="log", yaxis_title="% of requests", yaxis_range=[0, 105], height=360,
                      margin={"l": 60, "r": 20, "t": 70 if where else 50, "b": 40},
                      legend={"orientation": "h", "y": -0.25})
    return fig


@mime_figure
def routed_figure(routed, title: str = "Requests sent to each replica", where: str = "") -> go.Figure:
    """``routed``: requests per replica, in replica order (a hot prefix piled on one replica shows at a glance)."""
    routed = list(routed)
    if not routed:
        raise ValueError("no replicas to draw")
    names = [f"replica {k}" for k in range(len(routed))]
    fig = go.Figure(go.Bar(x=names, y=routed, marker={"color": colour(0)},
                           hovertemplate="%{x}: %{y} requests<extra></extra>"))
    fig.update_layout(title=titled(title, where), yaxis_title="requests", yaxis_range=[0, max(routed) + 1],
                      height=300, margin={"l": 60, "r": 20, "t": 70 if where else 50, "b": 40})
    return fig
