"""Data parallelism's figures: memory per rank, bytes per step, ZeRO's table for real models, the
overlap timeline (of a training step, or of the ring's attention), activations with and without
recomputation. Data in, ``go.Figure`` out."""

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
MESSAGE_COLOURS = {"send": GREEN, "recv": PURPLE}


@mime_figure
def strategy_bars_figure(measured: Mapping[str, Mapping[str, float]], parts: Sequence[str],
                         predicted: Mapping[str, float | Mapping[str, float]] | None = None,
                         title: str = "What one rank keeps between steps", yaxis_title: str = "KiB") -> go.Figure:
    """Stacked bars per strategy, a segment per part (``measured[strategy][part]`` bytes, measured on the
    ranks: what a rank keeps, or what it sent per op), with a red marker at each predicted total (a number
    of bytes, or the predicted parts, added up)."""
    names = list(measured)
    labels = [STRATEGY_TITLES.get(s, s) for s in names]
    fig = go.Figure()
    for part in parts:
        fig.add_trace(go.Bar(name=part, x=labels, y=[measured[s].get(part, 0) / 1024 for s in names],
                             marker_color=PART_COLOURS.get(part, OP_COLOURS.get(part, TEAL)),
                             hovertemplate=f"%{{x}}: {part} %{{y:,.1f}} KiB<extra>measured</extra>"))
    if predicted:
        totals = [p if isinstance(p, (int, float)) else sum(p[k] for k in parts)
                  for p in (predicted[s] for s in names)]
        fig.add_trace(go.Scatter(name="predicted total", x=labels, y=[t / 1024 for t in totals], mode="markers",
                                 marker={"symbol": "line-ew-open", "size": 40, "color": RED, "line": {"width": 3}}))
    fig.update_layout(title=title, barmode="stack", yaxis_title=yaxis_title, yaxis_rangemode="tozero", height=360,
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
def overlap_timeline_figure(spans: Sequence[Span], title: str, step: int | None = None) -> go.Figure:
    """Each rank's compute on one row (its phases or its ring steps, grey where it blocked in ``wait()``)
    above its communication: one row of collectives, or a send row and a receive row, each bar from the
    issue until the rank confirmed it in ``wait`` (on gloo the only completion it is told of). A transfer
    bar under a compute bar is communication hidden under compute. ``step``: that training step only."""
    if step is not None:
        window = {s.rank: s for s in spans if s.kind == "step" and s.attrs.get("step") == step}
        if not window:
            raise ValueError(f"no spans of step {step} to draw")
        spans = [s for s in spans if s.kind != "step" and s.rank in window
                 and window[s.rank].start_s <= s.start_s <= window[s.rank].end_s]
    if not spans:
        raise ValueError("no spans to draw: run it first")
    comm_rows = ("send", "recv") if any(s.name in ("send", "recv") for s in spans) else ("comm",)
    bars = []
    for s in shift_to_zero(sorted(spans, key=lambda s: s.start_s), min(s.start_s for s in spans)):
        start, end = s.start_s * 1e3, s.end_s * 1e3
        if s.kind == "compute":
            group = s.name if s.name in PHASE_COLOURS else "compute"
            bars.append(Bar(f"rank {s.rank} compute", start, end, s.name, group,
                            PHASE_COLOURS.get(s.name, BLUE)))
        elif s.kind == "wait":
            bars.append(Bar(f"rank {s.rank} compute", start, end, s.name, "blocked, waiting for the transfer",
                            WAIT_COLOUR))
        elif s.kind == "comm" and s.name in ("send", "recv"):
            label, colour = f"{s.name} {s.attrs.get('size_bytes', 0) / 2 ** 20:.1f} MiB", MESSAGE_COLOURS[s.name]
            bars.append(Bar(f"rank {s.rank} {s.name}", start, end, label, f"{s.name} in flight", colour))
        elif s.kind == "comm":
            bars.append(Bar(f"rank {s.rank} comm", start, end, s.name, s.name, OP_COLOURS.get(s.name, ORANGE)))
    ranks = sorted({s.rank for s in spans})
    return gantt_figure(bars, [f"rank {r} {what}" for r in ranks for what in ("compute", *comm_rows)], title)


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
