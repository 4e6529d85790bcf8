"""Data parallelism's figures: memory per rank, bytes per step, ZeRO's table for real models, the
overlap timeline, activations with and without recomputation. Data in, ``go.Figure`` out."""

from __future__ import annotations

from typing import Mapping, Sequence

import plotly.graph_objects as go

from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.runtime.timeline import Span, shift_to_zero
from shardlib.ui.gantt import Bar, gantt_figure
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, GREEN, GREY, LIGHT_BLUE, OP_COLOURS, ORANGE, PURPLE, RED, TEAL, WAIT_COLOUR

PART_COLOURS = {"params": BLUE, "grads": ORANGE, "optimizer": GREEN, "activations": PURPLE}
PHASE_COLOURS = {"forward": BLUE, "backward": LIGHT_BLUE, "optimizer": GREEN}


@mime_figure
def memory_per_rank_figure(measured: Mapping[str, Mapping[str, float]],
                           predicted: Mapping[str, Mapping[str, float]] | None = None,
                           title: str = "What one rank keeps between steps", unit: str = "KiB") -> go.Figure:
    """Stacked bars per strategy (``params``, ``grads``, ``optimizer``: measured on the ranks), with a
    marker at each predicted total."""
    scale = {"KiB": 1024, "MB": 1e6, "GB": 1e9}[unit]
    names = list(measured)
    labels = [STRATEGY_TITLES.get(s, s) for s in names]
    fig = go.Figure()
    for part in ("params", "grads", "optimizer"):
        fig.add_trace(go.Bar(name=part, x=labels, y=[measured[s][part] / scale for s in names],
                             marker_color=PART_COLOURS[part],
                             hovertemplate=f"%{{x}}: {part} %{{y:,.1f}} {unit}<extra>measured</extra>"))
    if predicted:
        fig.add_trace(go.Scatter(name="predicted total", x=labels, mode="markers",
                                 y=[sum(predicted[s][p] for p in ("params", "grads", "optimizer")) / scale
                                    for s in names],
                                 marker={"symbol": "line-ew-open", "size": 40, "color": RED, "line": {"width": 3}}))
    fig.update_layout(title=title, barmode="stack", yaxis_title=unit, yaxis_rangemode="tozero", height=360,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig


@mime_figure
def step_bytes_figure(measured: Mapping[str, Mapping[str, float]], predicted: Mapping[str, float] | None = None,
                      title: str = "Bytes one rank sends per step, by collective") -> go.Figure:
    """Stacked bars per strategy: wire bytes per op (``{strategy: {op: bytes}}``, measured), with a marker
    at each predicted total (``{strategy: bytes}``)."""
    names = list(measured)
    labels = [STRATEGY_TITLES.get(s, s) for s in names]
    ops = list(dict.fromkeys(op for s in names for op in measured[s]))
    fig = go.Figure()
    for op in ops:
        fig.add_trace(go.Bar(name=op, x=labels, y=[measured[s].get(op, 0) / 1024 for s in names],
                             marker_color=OP_COLOURS.get(op, TEAL),
                             hovertemplate=f"%{{x}}: {op} %{{y:,.1f}} KiB<extra>measured</extra>"))
    if predicted:
        fig.add_trace(go.Scatter(name="predicted", x=labels, y=[predicted[s] / 1024 for s in names], mode="markers",
                                 marker={"symbol": "line-ew-open", "size": 40, "color": RED, "line": {"width": 3}}))
    fig.update_layout(title=title, barmode="stack", yaxis_title="KiB on the wire (ring convention)",
                      yaxis_rangemode="tozero", height=360,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig


@mime_figure
def zero_table_figure(rows: Sequence[Mapping], gpu_memory_bytes: Mapping[str, float] | None = None,
                      title: str = "Memory per GPU for mixed-precision Adam, (2 + 2 + 12) bytes per parameter",
                      ) -> go.Figure:
    """One group of stacked bars per model (rows of ``predict.zero_table``), a bar per strategy, and a
    dashed line per GPU's memory."""
    fig = go.Figure()
    x = [[r["model"] for r in rows], [STRATEGY_TITLES.get(r["strategy"], r["strategy"]) for r in rows]]
    for part in ("params", "grads", "optimizer"):
        fig.add_trace(go.Bar(name=part, x=x, y=[r[f"{part}_gb"] for r in rows], marker_color=PART_COLOURS[part],
                             hovertemplate=f"{part} %{{y:,.1f}} GB<extra></extra>"))
    for i, (gpu, size) in enumerate((gpu_memory_bytes or {}).items()):
        fig.add_hline(y=size / 1e9, line_dash="dash", line_color=(RED, GREY)[i % 2],
                      annotation_text=f"{gpu}: {size / 1e9:.0f} GB", annotation_position="top right")
    dp = rows[0]["dp"] if rows else 0
    fig.update_layout(title=f"{title}, dp = {dp}", barmode="stack", yaxis_title="GB per GPU", yaxis_type="log",
                      height=420, margin={"l": 60, "r": 20, "t": 50, "b": 60})
    return fig


@mime_figure
def overlap_timeline_figure(spans: Sequence[Span], step: int, title: str) -> go.Figure:
    """One training step on every rank: a compute row (forward, backward, optimizer, and grey where the
    rank blocked in ``wait()``) above a communication row (each collective from issue to completion).
    A collective bar under a backward bar is communication hidden under compute."""
    window = {s.rank: s for s in spans if s.kind == "step" and s.attrs.get("step") == step}
    if not window:
        raise ValueError(f"no spans of step {step} to draw")
    mine = [s for s in spans if s.rank in window and window[s.rank].start_s <= s.start_s <= window[s.rank].end_s
            and s.kind != "step"]
    origin = min(w.start_s for w in window.values())
    bars, rows = [], []
    for rank in sorted(window):
        rows += [f"rank {rank} compute", f"rank {rank} comm"]
    for s in shift_to_zero(mine, origin):
        start, end = s.start_s * 1e3, s.end_s * 1e3
        if s.kind == "comm":
            bars.append(Bar(f"rank {s.rank} comm", start, end, s.name, s.name, OP_COLOURS.get(s.name, ORANGE)))
        elif s.kind == "wait":
            bars.append(Bar(f"rank {s.rank} compute", start, end, s.name, "waiting for a collective", WAIT_COLOUR))
        elif s.name in PHASE_COLOURS:
            bars.append(Bar(f"rank {s.rank} compute", start, end, s.name, s.name, PHASE_COLOURS[s.name]))
    return gantt_figure(bars, rows, title)


@mime_figure
def activation_figure(measurements: Mapping[str, Sequence[int]], unit_names: Sequence[str],
                      predicted: Mapping[str, Sequence[int]] | None = None,
                      title: str = "Bytes each layer keeps for its backward") -> go.Figure:
    """Grouped bars per unit, one series per setting (``{label: bytes per unit}``, measured), with the
    predicted bytes as markers."""
    fig = go.Figure()
    colours = (PURPLE, TEAL, BLUE, ORANGE)
    for i, (label, values) in enumerate(measurements.items()):
        fig.add_trace(go.Bar(name=label, x=[f"layer {n}" for n in unit_names], y=[v / 1024 for v in values],
                             marker_color=colours[i % len(colours)], offsetgroup=str(i),
                             hovertemplate="%{x}: %{y:,.1f} KiB<extra>" + label + "</extra>"))
        if predicted and label in predicted:
            fig.add_trace(go.Scatter(name=f"{label}: predicted", x=[f"layer {n}" for n in unit_names],
                                     y=[v / 1024 for v in predicted[label]], mode="markers",
                                     marker={"symbol": "x", "size": 10, "color": RED}))
    fig.update_layout(title=title, barmode="group", yaxis_title="KiB", height=340,
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return fig
