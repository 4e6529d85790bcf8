"""Figures of tensor parallelism: who holds which slice of a pair, how the code cuts one ``(out, in)``
weight, and what the KV cache per GPU does as tp passes the KV heads. Data in, ``go.Figure`` out."""

from __future__ import annotations

import plotly.graph_objects as go

from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, ORANGE, owner_heatmap


@mime_figure
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
    for col, owners in ((1, owner_w1), (2, owner_w2)):
        fig.add_trace(owner_heatmap(owners, tp, "row %{y}, column %{x}: rank %{z}<extra></extra>", col == 2),
                      row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=360, title=f"{tp} ranks: each colour is one rank's slice")
    return fig


@mime_figure
def weight_cut_figure(out_features: int, in_features: int, n_shards: int) -> go.Figure:
    """One ``nn.Linear`` weight, stored ``(out_features, in_features)``, cut both ways the code cuts it:
    each cell is coloured by the shard that holds it, as ``shard_columns`` and ``shard_rows`` return it.

    The names follow the maths convention ``y = x A`` with ``A = W.T`` of shape ``(in, out)``:
    ``shard_columns`` cuts A's columns, which are W's dim 0 (rows of the stored tensor: whole output
    features, the whole input needed); ``shard_rows`` cuts A's rows, which are W's dim 1 (columns of the
    stored tensor: a slice of the input features, a partial sum over every output feature)."""
    import torch
    from plotly.subplots import make_subplots

    from shardlib.core.tensor_parallel.layers import shard_columns, shard_rows

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
    for col, name in ((1, "columns"), (2, "rows")):
        fig.add_trace(owner_heatmap(owners[name], n_shards, "W[%{y}, %{x}]: shard %{z}<extra></extra>", col == 2,
                                    "shard", xgap=1, ygap=1, name=f"shard_{name}"), row=1, col=col)
        fig.update_xaxes(title_text="dim 1: input feature (in_features)", row=1, col=col)
        fig.update_yaxes(title_text="dim 0: output feature (out_features)", autorange="reversed", row=1, col=col)
    fig.update_layout(height=400, margin={"t": 110},
                      title=f"One nn.Linear weight W, stored ({out_features} out, {in_features} in), "
                            f"cut {n_shards} ways")
    return fig


@mime_figure
def kv_cache_per_gpu_figure(model_name: str, n_kv_heads: int, degrees, cache_bytes, weight_bytes) -> go.Figure:
    """One sequence's KV cache and the weights per GPU against ``tp`` (log-log): the weights keep halving,
    the cache flattens once ``tp`` passes the ``n_kv_heads`` KV heads (each then copied). Shape arithmetic."""
    degrees = list(degrees)
    fig = go.Figure()
    fig.add_scatter(x=degrees, y=[b / 2**30 for b in weight_bytes], mode="lines+markers", name="weights per GPU",
                    line={"color": BLUE})
    fig.add_scatter(x=degrees, y=[b / 2**30 for b in cache_bytes], mode="lines+markers",
                    name="one sequence's KV cache per GPU", line={"color": ORANGE})
    fig.add_vline(x=n_kv_heads, line_dash="dot", annotation_text=f"{n_kv_heads} KV heads: copies begin")
    fig.update_xaxes(type="log", tickvals=degrees, title_text="tp (GPUs in the tensor-parallel group)")
    fig.update_yaxes(type="log", title_text="GiB per GPU")
    fig.update_layout(title=f"{model_name}: memory per GPU against tp (a model: shape arithmetic, not a "
                            "measurement)", height=360, margin={"t": 60})
    return fig
