"""The serving engine's figures: each request's life on one row (waiting, then its tokens), and KV memory.
Plotly only: data in, a figure out."""

from __future__ import annotations

import plotly.graph_objects as go

from shardlib.ui.gantt import row_axis, titled
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import colour


@mime_figure
def token_timeline_figure(requests, token_times_s: dict, title: str = "Each request: waiting, then its tokens",
                          where: str = "", limit: int = 16) -> go.Figure:
    """Rows: the first ``limit`` requests by arrival; x: milliseconds after the first arrival. A grey bar from
    a request's arrival to its first token (TTFT), a dot at every generated token: continuous batching (a
    newcomer starts while others decode), static batching (newcomers wait for a whole batch) and a prefill
    stall (a gap in everyone's dots) read at a glance."""
    if not token_times_s:
        raise ValueError("no token times to draw: serve some requests first")
    shown = sorted((r for r in requests if r.request_id in token_times_s), key=lambda r: r.arrival_s)[:limit]
    t0 = min(r.arrival_s for r in shown)
    rows = [f"request {r.request_id}" for r in shown]
    wait = go.Bar(orientation="h", name="waiting for its first token (TTFT)", y=rows,
                  base=[(r.arrival_s - t0) * 1e3 for r in shown],
                  x=[max((token_times_s[r.request_id][0] - r.arrival_s) * 1e3, 1e-6) for r in shown],
                  marker={"color": "lightgrey"}, width=0.5,
                  hovertemplate="%{y}: waited %{x:.1f} ms<extra></extra>")
    xs, ys = [], []
    for r, row in zip(shown, rows):
        for t in token_times_s[r.request_id]:
            xs.append((t - t0) * 1e3)
            ys.append(row)
    dots = go.Scatter(x=xs, y=ys, mode="markers", name="a generated token", marker={"color": colour(0), "size": 6},
                      hovertemplate="%{y}: a token at %{x:.1f} ms<extra></extra>")
    fig = go.Figure([wait, dots])
    fig.update_layout(title=titled(title, where), barmode="overlay", xaxis_title="time after the first arrival (ms)",
                      yaxis=row_axis(rows), height=140 + 24 * len(rows),
                      margin={"l": 90, "r": 20, "t": 70 if where else 50, "b": 40},
                      legend={"orientation": "h", "y": -0.15 if len(rows) > 6 else -0.4})
    return fig


@mime_figure
def kv_use_figure(paged: float, contiguous: float, paper: tuple[float, float], where: str = "") -> go.Figure:
    """Bars: the share of KV slots holding real tokens, paged and reserved, beside the paper's range."""
    names = ["paged blocks (this run)", "each request reserves the context", "earlier systems (vLLM paper)"]
    fig = go.Figure(go.Bar(x=names, y=[paged * 100, contiguous * 100, (paper[0] + paper[1]) / 2 * 100],
                           error_y={"type": "data", "array": [0, 0, (paper[1] - paper[0]) / 2 * 100]},
                           marker={"color": [colour(0), colour(1), "grey"]},
                           hovertemplate="%{x}: %{y:.1f} %<extra></extra>"))
    fig.update_layout(title=titled("KV memory holding real tokens", where), yaxis_title="% of the slots in use",
                      yaxis_range=[0, 105], height=340, margin={"l": 60, "r": 20, "t": 70 if where else 50, "b": 40})
    return fig


@mime_figure
def block_table_figure(manager, where: str = "") -> go.Figure:
    """Each sequence's block table (``BlockManager.tables``): a row per sequence, a cell per logical block,
    the physical block it maps to written in it; a block two or more sequences share is darker."""
    seqs = list(manager.tables)
    width = max(len(t) for t in manager.tables.values())
    text = [[f"block {t[i]}" if i < len(t) else "" for i in range(width)] for t in manager.tables.values()]
    shared = [[int(manager.refs[t[i]] > 1) if i < len(t) else None for i in range(width)]
              for t in manager.tables.values()]
    fig = go.Figure(go.Heatmap(z=shared, text=text, texttemplate="%{text}", showscale=False, xgap=2, ygap=2,
                               colorscale=[[0, "#c6dbef"], [1, "#4c78a8"]], zmin=0, zmax=1,
                               x=[f"logical {i}" for i in range(width)], y=[f"sequence {s}" for s in seqs],
                               hovertemplate="%{y}, %{x}: physical %{text}<extra></extra>"))
    fig.update_layout(title=titled("Block tables: logical blocks to physical blocks (dark: shared)", where),
                      yaxis={"autorange": "reversed"}, height=120 + 45 * len(seqs),
                      margin={"l": 90, "r": 20, "t": 60, "b": 40})
    return fig
