"""General figures: what each rank did, bytes moved, weights against memory, measured points, who holds
which slice of a pair, and how the code cuts one ``(out, in)`` weight. Data in, ``go.Figure`` out: no
widgets, no processes."""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from ..runtime.records import CommRecord
from ..runtime.timeline import Span, shift_to_zero
from .gantt import Bar, gantt_figure
from .theme import GREEN, KIND_COLOURS, PURPLE, RED, TEAL, colour, colours


def timeline_figure(spans: Sequence[Span], origin_s: float | None = None, title: str = "What each rank did") -> go.Figure:
    """A Gantt chart: one row per rank, one bar per span, coloured by kind, time in milliseconds.

    ``origin_s`` is the time zero (for example ``ranks.last_started_s``); by default the earliest span.
    """
    if not spans:
        raise ValueError("no spans to draw: run a rank function that records some first")
    spans = shift_to_zero(list(spans), origin_s)
    bars = [Bar(f"rank {s.rank}", s.start_s * 1e3, s.end_s * 1e3, s.name, s.kind, KIND_COLOURS.get(s.kind, TEAL))
            for s in sorted(spans, key=lambda s: s.kind)]
    return gantt_figure(bars, [f"rank {r}" for r in sorted({s.rank for s in spans})], title)


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
    """Bars of each model's weight bytes (GB) with a dashed line per GPU memory size; GPUs of the same
    size share one line, labelled with all their names."""
    names = list(weight_bytes)
    fig = go.Figure(go.Bar(x=names, y=[weight_bytes[n] / 1e9 for n in names], name="weights",
                           marker_color=colour(0), text=[f"{weight_bytes[n] / 1e9:.0f} GB" for n in names],
                           textposition="outside"))
    by_size: dict[float, list[str]] = {}
    for gpu, size in gpu_memory_bytes.items():
        by_size.setdefault(size, []).append(gpu)
    for i, (size, gpus) in enumerate(sorted(by_size.items())):
        fig.add_hline(y=size / 1e9, line_dash="dash", line_color=(RED, GREEN, PURPLE)[i % 3],
                      annotation_text=f"{', '.join(gpus)}: {size / 1e9:.0f} GB", annotation_position="top left")
    fig.update_layout(title=title, yaxis_title="GB", height=420)
    return fig


def measured_points_figure(x: Sequence[float], y: Sequence[float], x_title: str, y_title: str, title: str,
                           log_x: bool = True) -> go.Figure:
    """A scatter of measured points (for example all-reduce time against message size)."""
    fig = go.Figure(go.Scatter(x=list(x), y=list(y), mode="markers+lines", name="measured"))
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=340,
                      xaxis_type="log" if log_x else "linear")
    return fig


def _owner_scale(n: int) -> list:
    """A plotly colour scale giving owner ``0 .. n-1`` (rank or shard) its palette colour."""
    return [[k / (n - 1), c] for k, c in enumerate(colours(n))] if n > 1 else [[0, colour(0)], [1, colour(0)]]


def shard_layout_figure(tp: int, d_in: int, d_hidden: int, d_out: int) -> go.Figure:
    """Which rank holds which part of a column-then-row pair: ``W1 (d_hidden, d_in)`` cut by output
    rows (column parallel), ``W2 (d_out, d_hidden)`` cut by input columns (row parallel)."""
    from plotly.subplots import make_subplots

    if d_hidden % tp:
        raise ValueError(f"d_hidden = {d_hidden} cannot be split {tp} ways")
    per = d_hidden // tp
    owner_w1 = [[i // per] * d_in for i in range(d_hidden)]  # row i of W1 -> rank
    owner_w2 = [[j // per for j in range(d_hidden)] for _ in range(d_out)]  # column j of W2 -> rank
    fig = make_subplots(rows=1, cols=2, column_widths=[d_in, d_hidden], horizontal_spacing=0.08,
                        subplot_titles=(f"first: W1 ({d_hidden} x {d_in}), split by columns of the output",
                                        f"second: W2 ({d_out} x {d_hidden}), split by rows of the input"))
    scale = _owner_scale(tp)
    for col, owners in ((1, owner_w1), (2, owner_w2)):
        fig.add_trace(go.Heatmap(z=owners, colorscale=scale, zmin=0, zmax=max(tp - 1, 1), showscale=col == 2,
                                 colorbar={"title": "rank", "tickvals": list(range(tp))},
                                 hovertemplate="row %{y}, column %{x}: rank %{z}<extra></extra>"), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=360, title=f"{tp} ranks: each colour is one rank's slice")
    return fig


def weight_cut_figure(out_features: int, in_features: int, n_shards: int) -> go.Figure:
    """One ``nn.Linear`` weight, stored ``(out_features, in_features)``, cut both ways the code cuts it:
    each cell is coloured by the shard that holds it, as ``shard_columns`` and ``shard_rows`` return it.

    The names follow the maths convention ``y = x A`` with ``A = W.T`` of shape ``(in, out)``:
    ``shard_columns`` cuts A's columns, which are W's dim 0 (rows of the stored tensor: whole output
    features, the whole input needed); ``shard_rows`` cuts A's rows, which are W's dim 1 (columns of the
    stored tensor: a slice of the input features, a partial sum over every output feature)."""
    import torch
    from plotly.subplots import make_subplots

    from ..tensor_parallel.split import shard_columns, shard_rows

    cells = torch.arange(out_features * in_features).view(out_features, in_features)  # (out, in): cell ids
    owners = {}
    for name, cut in (("columns", shard_columns), ("rows", shard_rows)):
        owner = torch.empty(out_features * in_features, dtype=torch.long)
        for shard, part in enumerate(cut(cells, n_shards)):  # the code's own split decides who holds what
            owner[part.flatten()] = shard
        owners[name] = owner.view(out_features, in_features).tolist()
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, subplot_titles=(
        f"shard_columns(W, {n_shards}): cuts dim 0, the output features<br>"
        "(columns of W.T in y = x W.T; rows of the stored W)",
        f"shard_rows(W, {n_shards}): cuts dim 1, the input features<br>"
        "(rows of W.T; columns of the stored W)"))
    scale = _owner_scale(n_shards)
    for col, name in ((1, "columns"), (2, "rows")):
        fig.add_trace(go.Heatmap(z=owners[name], colorscale=scale, zmin=0, zmax=max(n_shards - 1, 1),
                                 showscale=col == 2, colorbar={"title": "shard", "tickvals": list(range(n_shards))},
                                 xgap=1, ygap=1, name=f"shard_{name}",
                                 hovertemplate="W[%{y}, %{x}]: shard %{z}<extra></extra>"), row=1, col=col)
        fig.update_xaxes(title_text="dim 1: input feature (in_features)", row=1, col=col)
        fig.update_yaxes(title_text="dim 0: output feature (out_features)", autorange="reversed", row=1, col=col)
    fig.update_layout(height=400, margin={"t": 110},
                      title=f"One nn.Linear weight W, stored ({out_features} out, {in_features} in), cut {n_shards} ways")
    return fig
