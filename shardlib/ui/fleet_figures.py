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


@mime_figure
def handoff_links_figure(n_kv_heads: int, splits=((1, 2), (2, 1))) -> go.Figure:
    """The KV hand-off between pools of different TP, one panel per ``(prefill, decode)`` split: prefill ranks
    on the left, decode ranks on the right, each holding its KV heads, and a line per rank pair that exchanges
    K/V, labelled with the heads it carries (``core.serving.handoff.head_overlaps``, what the run sends)."""
    from plotly.subplots import make_subplots

    from shardlib.core.serving.handoff import head_overlaps, kv_heads_held

    fig = make_subplots(rows=1, cols=len(splits), subplot_titles=[f"{p} prefill + {d} decode" for p, d in splits])
    for col, (p, d) in enumerate(splits, start=1):
        def heads(i, tp):
            held = kv_heads_held(i, tp, n_kv_heads)
            return ", ".join(str(h) for h in held)
        for side, x, n, name in ((0, 0.0, p, "prefill"), (1, 1.0, d, "decode")):
            ys = [(n - 1) / 2 - i for i in range(n)]
            fig.add_trace(go.Scatter(x=[x] * n, y=ys, mode="markers+text", marker={"size": 38, "color": colour(side)},
                                     text=[f"{name} {i}<br>heads {heads(i, n)}" for i in range(n)],
                                     textposition="middle left" if side == 0 else "middle right",
                                     hoverinfo="skip", showlegend=False), row=1, col=col)
        for link in head_overlaps(n_kv_heads, p, d):
            y0, y1 = (p - 1) / 2 - link.prefill, (d - 1) / 2 - link.decode
            fig.add_trace(go.Scatter(x=[0.0, 1.0], y=[y0, y1], mode="lines", line={"color": "grey", "width": 3},
                                     hoverinfo="skip", showlegend=False), row=1, col=col)
            fig.add_annotation(x=0.5, y=(y0 + y1) / 2, text=f"head {', '.join(map(str, link.heads))}",
                               showarrow=False, bgcolor="white", row=1, col=col)
        fig.update_xaxes(range=[-0.9, 1.9], visible=False, row=1, col=col)
        fig.update_yaxes(range=[-1.5, 1.5], visible=False, row=1, col=col)
    title = f"The hand-off's rank pairs, {n_kv_heads} KV heads: each line carries the heads both ends hold"
    fig.update_layout(plot_bgcolor="white", title=title, height=300, margin={"l": 20, "r": 20, "t": 70, "b": 20})
    return fig
