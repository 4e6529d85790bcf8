"""Figures of notebook 00: a model's weights against a GPU's memory. Data in, ``go.Figure`` out."""

from __future__ import annotations

from typing import Mapping

import plotly.graph_objects as go

from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import GREEN, PURPLE, RED, colour


@mime_figure
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
