"""Plotly figures for sequence and context parallelism: data in, ``go.Figure`` out.

Which K/V block each rank holds at each step of the ring; who computes which block of the causal
attention matrix in each placement; per-rank compute measured against the blocks predicted; memory per
device against sequence length, and what one rank holds (the ring's timeline:
``data_parallel_figures.overlap_timeline_figure``).
No torch, no widgets, no processes: the numbers come from ``shardlib.lab.context_parallel``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlib.core.context_parallel.placement import (
    DIAGONAL,
    FUTURE,
    PLACEMENTS,
    block_kind,
    chunks_of_rank,
    chunks_per_rank,
)
from shardlib.predict.context_parallel import blocks_between
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, GREY, ORANGE, RED, colour, owner_heatmap


@mime_figure
def ring_steps_figure(world_size: int, placement: str = "contiguous", causal: bool = True) -> go.Figure:
    """A grid, ranks down and ring steps across: whose K/V each rank holds at each step, and how much
    of it it computes (whole, diagonal only, or nothing: the block is in its queries' future)."""
    n = world_size
    text, z = [], []
    for r in range(n):
        row_text, row_z = [], []
        for step in range(n):
            src, blocks = (r - step) % n, chunks_per_rank(placement) ** 2
            done = sum(blocks_between(r, src, n, placement, causal))
            row_text.append(f"K/V of rank {src}<br>{done} of {blocks} block{'s' if blocks > 1 else ''}")
            row_z.append(done / blocks)
        text.append(row_text)
        z.append(row_z)
    fig = go.Figure(go.Heatmap(z=z, x=[f"step {i}" for i in range(n)], y=[f"rank {r}" for r in range(n)], text=text,
                               texttemplate="%{text}", zmin=0, zmax=1, colorscale=[[0, "#f2f2f2"], [1, BLUE]],
                               showscale=False, hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"The ring, {placement} placement{' (causal)' if causal else ''}: each step every rank "
                            "passes its K/V on to the next", height=120 + 60 * n)
    return fig


@mime_figure
def block_owner_figure(world_size: int) -> go.Figure:
    """The causal attention matrix cut into ``2 x world_size`` chunks each way, each block coloured by the
    rank that computes it (blank: skipped, in the future), contiguous placement and zigzag side by side."""
    fine = 2 * world_size

    def cell(placement: str, qc: int, kc: int):
        per = 2 // chunks_per_rank(placement)  # fine chunks per chunk of this placement: 2 contiguous, 1 zigzag
        a, b = qc // per, kc // per
        owner = next(r for r in range(world_size) if a in chunks_of_rank(r, world_size, placement))
        kind = block_kind(a, b, True)
        return (None, "") if kind == FUTURE else (owner, f"rank {owner}{' (diagonal)' if kind == DIAGONAL else ''}")

    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=["contiguous: 1 chunk per rank", "zigzag: chunks r and 2n - 1 - r"])
    for col, placement in enumerate(PLACEMENTS, start=1):
        cells = [[cell(placement, qc, kc) for kc in range(fine)] for qc in range(fine)]
        fig.add_trace(owner_heatmap([[c[0] for c in row] for row in cells], world_size,
                                    "queries %{y}, keys %{x}: %{text}<extra></extra>", col == 2,
                                    text=[[c[1] for c in row] for row in cells], xgap=1, ygap=1), row=1, col=col)
    fig.update_yaxes(autorange="reversed", title_text=f"query chunk (of {fine})")
    fig.update_xaxes(title_text=f"key chunk (of {fine})")
    fig.update_layout(title=f"Who computes which block of causal attention, {world_size} ranks", height=380)
    return fig


@mime_figure
def balance_figure(compute_s: Mapping[str, Sequence[float]], predicted_scores: Mapping[str, Sequence[int]],
                   timing_note: str = "CPU time of each rank's compute, median of the passes") -> go.Figure:
    """Per-rank compute measured (bars, ms) in each placement, and (diamonds) the measured total split
    between the ranks as the predicted work (``RankWork.scores``) splits it."""
    fig = go.Figure()
    for i, placement in enumerate(compute_s):
        measured, work = list(compute_s[placement]), list(predicted_scores[placement])
        ranks = [f"rank {r}" for r in range(len(measured))]
        fig.add_trace(go.Bar(x=ranks, y=[c * 1e3 for c in measured], name=f"{placement}: measured",
                             marker_color=(ORANGE, BLUE)[i % 2], offsetgroup=str(i)))
        fig.add_trace(go.Scatter(x=ranks, y=[sum(measured) * 1e3 * w / sum(work) for w in work],
                                 name=f"{placement}: the total split as predicted", mode="markers", offsetgroup=str(i),
                                 marker={"symbol": "diamond", "size": 12, "color": (RED, "#1f3b63")[i % 2]}))
    fig.update_layout(title=f"Causal ring attention: work per rank ({timing_note})", barmode="group",
                      scattermode="group", yaxis_title="compute (ms)", height=360)
    return fig


@mime_figure
def memory_figure(seqs: Sequence[int], per_layout: Mapping[str, Sequence[float]], memory_bytes: float | None = None,
                  memory_label: str = "", title: str = "Memory per device against sequence length",
                  highlight: float | None = None) -> go.Figure:
    """One line per layout (``per_layout[label][i]`` bytes at ``seqs[i]`` tokens), log axes, with a
    dashed line at the device's memory and, if given, a marker line at ``highlight`` tokens."""
    fig = go.Figure()
    for i, (label, values) in enumerate(per_layout.items()):
        fig.add_trace(go.Scatter(x=list(seqs), y=[v / 1e9 for v in values], name=label, mode="lines+markers",
                                 line={"color": colour(i)}))
    if memory_bytes:
        fig.add_hline(y=memory_bytes / 1e9, line_dash="dash", line_color=RED,
                      annotation_text=memory_label or f"{memory_bytes / 1e9:.0f} GB", annotation_position="top left")
    if highlight:
        fig.add_vline(x=highlight, line_color=GREY, line_dash="dot")
    fig.update_layout(title=title, xaxis_title="sequence length (tokens)", yaxis_title="GB per device",
                      xaxis_type="log", yaxis_type="log", height=380)
    return fig


@mime_figure
def attention_memory_figure(parts: Mapping[str, Mapping[str, float]], title: str = "What one rank holds") -> go.Figure:
    """Stacked bars, one per way of running (``parts[label][part]`` bytes), in MiB."""
    names = list(dict.fromkeys(name for p in parts.values() for name in p))
    fig = go.Figure([go.Bar(x=list(parts), y=[parts[label].get(name, 0.0) / 2 ** 20 for label in parts], name=name,
                            marker_color=colour(i)) for i, name in enumerate(names)])
    fig.update_layout(title=title, barmode="stack", yaxis_title="MiB", height=340)
    return fig
