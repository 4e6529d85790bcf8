"""Plotly figure builders: data in, ``go.Figure`` out. No widgets, no processes, no torch.distributed."""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from .comm import CommRecord
from .timeline import Span, shift_to_zero

KIND_COLOURS = {"compute": "#4c78a8", "comm": "#f58518", "wait": "#bab0ac", "send": "#54a24b", "recv": "#b279a2"}


def timeline_figure(spans: Sequence[Span], origin_s: float | None = None, title: str = "What each rank did") -> go.Figure:
    """A Gantt chart: one row per rank, one bar per span, coloured by kind, time in milliseconds.

    ``origin_s`` is the time zero (for example ``ranks.last_started_s``); by default the earliest span.
    """
    if not spans:
        raise ValueError("no spans to draw: run a rank function that records some first")
    spans = shift_to_zero(list(spans), origin_s)
    fig = go.Figure()
    for kind in sorted({s.kind for s in spans}):
        mine = [s for s in spans if s.kind == kind]
        fig.add_trace(go.Bar(
            orientation="h",
            y=[f"rank {s.rank}" for s in mine],
            base=[s.start_s * 1e3 for s in mine],
            x=[max(s.duration_s * 1e3, 1e-3) for s in mine],
            name=kind,
            marker_color=KIND_COLOURS.get(kind, "#72b7b2"),
            text=[s.name for s in mine],
            customdata=[[s.name, s.duration_s * 1e3] for s in mine],
            hovertemplate="%{customdata[0]}: %{customdata[1]:.3f} ms<extra>%{y}</extra>",
        ))
    ranks = sorted({s.rank for s in spans})
    fig.update_layout(
        title=title, barmode="overlay", xaxis_title="time (ms)", height=140 + 45 * len(ranks),
        yaxis={"categoryorder": "array", "categoryarray": [f"rank {r}" for r in reversed(ranks)]},
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
    )
    return fig


def comm_bytes_figure(records: Sequence[CommRecord], title: str = "Bytes each rank moved, by operation") -> go.Figure:
    """Grouped bars: total ``size_bytes`` per op, one bar per rank."""
    totals: dict[tuple[int, str], int] = {}
    for r in records:
        totals[(r.rank, r.op)] = totals.get((r.rank, r.op), 0) + r.size_bytes
    ops = sorted({op for _, op in totals})
    fig = go.Figure()
    for rank in sorted({rank for rank, _ in totals}):
        fig.add_trace(go.Bar(name=f"rank {rank}", x=ops, y=[totals.get((rank, op), 0) for op in ops]))
    fig.update_layout(title=title, barmode="group", yaxis_title="bytes", height=320)
    return fig


def weights_vs_memory_figure(weight_bytes: Mapping[str, float], gpu_memory_bytes: Mapping[str, float],
                             title: str = "Weights alone, against one GPU's memory") -> go.Figure:
    """Bars of each model's weight bytes (GB) with a dashed line per GPU's memory."""
    names = list(weight_bytes)
    fig = go.Figure(go.Bar(x=names, y=[weight_bytes[n] / 1e9 for n in names], name="weights",
                           marker_color="#4c78a8", text=[f"{weight_bytes[n] / 1e9:.0f} GB" for n in names],
                           textposition="outside"))
    for i, (gpu, size) in enumerate(gpu_memory_bytes.items()):
        fig.add_hline(y=size / 1e9, line_dash="dash", line_color=["#e45756", "#54a24b", "#b279a2"][i % 3],
                      annotation_text=f"{gpu}: {size / 1e9:.0f} GB", annotation_position="top left")
    fig.update_layout(title=title, yaxis_title="GB", height=380)
    return fig


def measured_points_figure(x: Sequence[float], y: Sequence[float], x_title: str, y_title: str, title: str,
                           log_x: bool = True) -> go.Figure:
    """A scatter of measured points (for example all-reduce time against message size)."""
    fig = go.Figure(go.Scatter(x=list(x), y=list(y), mode="markers+lines", name="measured"))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=340,
                      xaxis_type="log" if log_x else "linear")
    return fig


def shard_layout_figure(n_shards: int, d_in: int, d_hidden: int, d_out: int) -> go.Figure:
    """Which rank holds which part of a column-then-row pair: ``W1 (d_hidden, d_in)`` cut by output
    rows (column parallel), ``W2 (d_out, d_hidden)`` cut by input columns (row parallel)."""
    from plotly.subplots import make_subplots

    if d_hidden % n_shards:
        raise ValueError(f"d_hidden = {d_hidden} cannot be split {n_shards} ways")
    per = d_hidden // n_shards
    owner_w1 = [[i // per] * d_in for i in range(d_hidden)]  # row i of W1 -> rank
    owner_w2 = [[j // per for j in range(d_hidden)] for _ in range(d_out)]  # column j of W2 -> rank
    fig = make_subplots(rows=1, cols=2, column_widths=[d_in, d_hidden], horizontal_spacing=0.08,
                        subplot_titles=(f"first: W1 ({d_hidden} x {d_in}), split by columns of the output",
                                        f"second: W2 ({d_out} x {d_hidden}), split by rows of the input"))
    scale = [[k / max(n_shards - 1, 1), c] for k, c in enumerate(_rank_colours(n_shards))] if n_shards > 1 else [[0, "#4c78a8"], [1, "#4c78a8"]]
    for col, owners in ((1, owner_w1), (2, owner_w2)):
        fig.add_trace(go.Heatmap(z=owners, colorscale=scale, zmin=0, zmax=max(n_shards - 1, 1), showscale=col == 2,
                                 colorbar={"title": "rank", "tickvals": list(range(n_shards))},
                                 hovertemplate="row %{y}, column %{x}: rank %{z}<extra></extra>"), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=360, title=f"{n_shards} ranks: each colour is one rank's slice")
    return fig


def _rank_colours(n: int) -> list[str]:
    palette = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#9d755d"]
    return [palette[i % len(palette)] for i in range(n)]
