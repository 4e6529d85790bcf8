"""Plotly figures of communication costs: data in, ``go.Figure`` out. No widgets, no processes.

Every predicted curve is drawn by the same ``costs`` function that the notebook prints its
predictions with, so a figure and a printed number can never disagree. Each figure says under its title
where its numbers come from: the ranks it measured (``where``), or that it is a model (``GPU_MODEL``).
``decode_vs_prefill_table`` prints a ``lab.costs.decode_vs_prefill.DecodeVsPrefillRun`` row by row.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlib.core.collectives import ring_chunks
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import collective_time_s, crossover_bytes
from shardlib.predict.serving.cost import PhaseCost
from shardlib.ui.gantt import titled
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, GREY, GUIDE_GREY, LABEL_GREY, LIGHT_BLUE, OP_COLOURS, RED, colour

GPU_MODEL = ("model: alpha-beta with each link's published bandwidth and an order-of-magnitude latency, "
             "not a measurement")
PLANNER_MODEL = "model: the planner's estimates (memory-bound decode, alpha-beta links), not a measurement"


def _size_grid(lo: float, hi: float, points: int = 60) -> list[float]:
    return list(np.logspace(np.log10(lo), np.log10(hi), points))


@mime_figure
def calibration_figure(samples: Sequence, link: Link, latency_charge: str = "per_step",
                       title: str = "Measured on this machine, with the fitted line", where: str = "") -> go.Figure:
    """Measured time against message size for each operation of a calibration (dots), the fitted link's
    prediction for it (line), and a diamond where each line turns from latency- to bandwidth-bound.
    ``where``: the ranks it was measured on (``ranks.description``), shown under the title."""
    if not samples:
        raise ValueError("no samples to draw: run run_calibration(ranks) first")
    fig = go.Figure()
    for op in dict.fromkeys(s.op for s in samples):
        mine = sorted((s for s in samples if s.op == op), key=lambda s: s.size_bytes)
        n, op_colour = mine[0].n_ranks, OP_COLOURS.get(op, GREY)
        fig.add_trace(go.Scatter(x=[s.size_bytes for s in mine], y=[s.seconds * 1e3 for s in mine], mode="markers",
                                 name=f"{op} measured", marker={"color": op_colour, "size": 8}))
        grid = _size_grid(mine[0].size_bytes, mine[-1].size_bytes)
        fig.add_trace(go.Scatter(x=grid, y=[collective_time_s(op, s, n, link, latency_charge) * 1e3 for s in grid],
                                 mode="lines", name=f"{op} fitted", line={"color": op_colour}))
        cross = crossover_bytes(link, op, n, latency_charge)
        fig.add_trace(go.Scatter(x=[cross], y=[collective_time_s(op, cross, n, link, latency_charge) * 1e3],
                                 mode="markers", marker={"symbol": "diamond", "size": 11, "color": op_colour},
                                 name=f"{op} crossover, {cross / 1024:,.0f} KiB"))
    fig.update_layout(title=titled(title, where), xaxis_type="log", yaxis_type="log", height=420,
                      xaxis_title="message size (bytes)", yaxis_title="time per call (ms, slowest rank)")
    return fig


@mime_figure
def link_comparison_figure(links: Sequence[Link], op: str = "all_reduce", n: int = 8,
                           marks: Mapping[str, float] | None = None, latency_charge: str = "per_step",
                           lo_bytes: float = 64, hi_bytes: float = 2 ** 30, where: str = GPU_MODEL) -> go.Figure:
    """Predicted time of ``op`` on ``n`` ranks against message size, one line per link, a diamond where
    each turns bandwidth-bound, and dashed verticals at the sizes in ``marks`` (label -> bytes); ``where``
    the numbers come from under the title (a model, by default)."""
    fig = go.Figure()
    grid = _size_grid(lo_bytes, hi_bytes)
    for i, link in enumerate(links):
        line_colour = colour(i)
        fig.add_trace(go.Scatter(x=grid, y=[collective_time_s(op, s, n, link, latency_charge) * 1e6 for s in grid],
                                 mode="lines", name=link.name, line={"color": line_colour}))
        cross = crossover_bytes(link, op, n, latency_charge)
        fig.add_trace(go.Scatter(x=[cross], y=[collective_time_s(op, cross, n, link, latency_charge) * 1e6],
                                 mode="markers", marker={"symbol": "diamond", "size": 10, "color": line_colour},
                                 name=f"{link.name}: crossover {cross / 1e6:.2g} MB", showlegend=False,
                                 hovertemplate=f"{link.name}<br>bandwidth-bound above {cross:,.0f} bytes"
                                               "<extra></extra>"))
    for label, size in (marks or {}).items():  # on a log axis an annotation is placed by log10(x): add_vline's is not
        fig.add_vline(x=size, line_dash="dash", line_color=GUIDE_GREY)
        fig.add_annotation(x=float(np.log10(size)), y=1.0, xref="x", yref="paper", text=label, showarrow=False,
                           xanchor="left", yanchor="bottom", font={"size": 11, "color": LABEL_GREY})
    fig.update_layout(title=titled(f"{op} on {n} ranks ({latency_charge} latency): diamonds mark the crossover",
                                   where),
                      xaxis_type="log", yaxis_type="log", height=440, xaxis_title="message size (bytes)",
                      yaxis_title="predicted time (us)")
    return fig


@mime_figure
def phase_cost_figure(costs: Sequence[PhaseCost], title: str = "Tensor-parallel communication per forward pass",
                      where: str = GPU_MODEL) -> go.Figure:
    """Stacked bars, one per ``PhaseCost``: the latency part and the bandwidth part, in milliseconds;
    ``where`` the numbers come from under the title (a model, by default)."""
    labels = [f"{c.phase}<br>{c.link}<br>tp={c.tp}" for c in costs]
    fig = go.Figure([
        go.Bar(x=labels, y=[c.latency_s * 1e3 for c in costs], name="latency (fixed cost per collective)",
               marker_color=RED),
        go.Bar(x=labels, y=[c.bandwidth_s * 1e3 for c in costs], name="bandwidth (bytes / rate)",
               marker_color=BLUE),
    ])
    fig.update_layout(title=titled(title, where), barmode="stack", yaxis_title="ms", height=380)
    return fig


@mime_figure
def slow_rank_figure(run, where: str = "") -> go.Figure:
    """Grouped bars for a ``costs.SlowRankRun``: the time each rank spent inside each collective, with the
    delay as a dashed line; ``where`` it was measured (``ranks.description``) under the title."""
    inside = [run.collective_s(op) for op in run.ops]  # (ops,) each (ranks,) seconds
    fig = go.Figure([go.Bar(name=f"rank {r}" + (" (slow)" if r == run.slow_rank else ""), x=run.ops,
                            y=[per_rank[r] * 1e3 for per_rank in inside], marker_color=colour(r))
                     for r in range(len(inside[0]))])
    fig.add_hline(y=run.delay_s * 1e3, line_dash="dash",
                  annotation_text=f"delay of rank {run.slow_rank}: {run.delay_s * 1e3:.0f} ms")
    fig.update_layout(title=titled("Time inside each collective: the fast ranks wait for the slow one", where),
                      barmode="group", yaxis_title="ms", height=360)
    return fig


@mime_figure
def replicas_vs_tp_figure(result, where: str = "") -> go.Figure:
    """Two panels for a ``costs.ReplicasVsTPRun``: latency per token (the step) and tokens per second per
    device, of replicas and of one tensor-parallel copy, measured (``where``: on which ranks) beside predicted."""
    measured, predicted = result.measured, result.predicted
    ways = ["replicas", f"tp = {measured.world_size}"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("latency per token (ms): lower is better",
                                                        "tokens per second per device: higher is better"))
    for stats, name, bar_colour in ((measured, "measured (median step)", BLUE), (predicted, "predicted", GREY)):
        fig.add_trace(go.Bar(name=name, x=ways, y=[stats.replica_step_s * 1e3, stats.tp_step_s * 1e3],
                             marker_color=bar_colour, legendgroup=name), row=1, col=1)
        fig.add_trace(go.Bar(name=name, x=ways, y=[stats.replicas_tokens_per_s_per_device,
                                                   stats.tp_tokens_per_s_per_device],
                             marker_color=bar_colour, legendgroup=name, showlegend=False), row=1, col=2)
    fig.update_layout(title=titled(f"{measured.world_size} devices, {measured.tokens_per_step} sequences per step: "
                                   "the split copy answers sooner, the replicas serve more", where),
                      barmode="group", height=360)
    return fig


@mime_figure
def latency_throughput_figure(curves: Mapping[str, Sequence], where: str = PLANNER_MODEL) -> go.Figure:
    """One line per entry of ``curves`` (label -> ``plan.ServingPoint`` s from ``latency_vs_throughput``):
    each serving option's latency per token for a lone request (x) against its tokens per second per GPU
    (y), replicas first, then tp = 2, 4, 8. Down and to the left is faster; up is more per GPU. Options
    that cannot serve (the model does not fit) are left out. ``where``: a model, said under the title."""
    fig = go.Figure()
    for i, (label, points) in enumerate(curves.items()):
        usable = [p for p in points if p.feasible and p.label != "1 GPU"]
        replicas = [p for p in usable if p.layout.tp == 1][:1]  # every count of replicas: the same point
        tensor = sorted((p for p in usable if p.layout.tp > 1), key=lambda p: p.layout.tp)
        shown = replicas + tensor
        names = ["replicas" if p.layout.tp == 1 else p.label for p in shown]
        fig.add_trace(go.Scatter(
            x=[p.latency_alone_s * 1e3 for p in shown], y=[p.tokens_per_s_per_gpu for p in shown],
            mode="lines+markers+text", name=label, text=names, textposition="top right",
            line={"color": colour(i)}, marker={"size": 9},
            customdata=[p.batch for p in shown],
            hovertemplate="%{text}: %{x:.2f} ms per token alone, %{y:,.0f} tokens/s per GPU, batch %{customdata}"
                          "<extra></extra>"))
    fig.update_layout(title=titled("Per-token latency against throughput per GPU", where), xaxis_type="log", height=420,
                      xaxis_title="latency per token, one request alone (ms, log scale)",
                      yaxis_title="tokens per second per GPU, full batch")
    return fig


def decode_vs_prefill_table(run) -> str:
    """A row per message: its size, then per tp degree the fastest round (median), prediction, ratio."""
    head = "".join(f"{'tp = ' + str(tp) + ': fastest (median)   predicted  ratio':>50}" for tp in run.tp_degrees)
    lines = [f"{'tokens':>7} {'bytes':>12}{head}"]
    for t in run.tokens:
        cells = "".join(f"{run.measured_s(tp, t) * 1e3:>16.3f} ms ({run.measured_s(tp, t, True) * 1e3:>7.3f}) "
                        f"{run.predicted_s(tp, t) * 1e3:>8.3f} ms {run.ratio(tp, t):>6.2f}" for tp in run.tp_degrees)
        lines.append(f"{t:>7,} {run.size_bytes(t):>12,}{cells}")
    return "\n".join(lines)


@mime_figure
def ring_figure(n: int = 4) -> go.Figure:
    """The ring all-reduce on ``n`` ranks, step by step: in each cell, the chunk a rank sends to the next
    (``core.collectives.ring_chunks``, the order the run follows); the reduce-scatter's steps, then the
    all-gather's."""
    steps = 2 * (n - 1)
    text = [[f"chunk {ring_chunks(n, r, s)[0]} → {(r + 1) % n}" for s in range(steps)] for r in range(n)]
    phase = [[0 if s < n - 1 else 1 for s in range(steps)] for _ in range(n)]
    fig = go.Figure(go.Heatmap(z=phase, text=text, texttemplate="%{text}", showscale=False, xgap=2, ygap=2,
                               colorscale=[[0, "#fdd0a2"], [1, LIGHT_BLUE]], zmin=0, zmax=1,
                               x=[f"step {s + 1}" for s in range(steps)], y=[f"rank {r}" for r in range(n)],
                               hovertemplate="%{y}, %{x}: %{text}<extra></extra>"))
    fig.update_layout(title=f"Ring all-reduce on {n} ranks: reduce-scatter (orange, steps 1-{n - 1}), then "
                            f"all-gather (blue)<br><sup>after the reduce-scatter rank r holds chunk r + 1 summed; "
                            "the all-gather passes the sums on</sup>",
                      yaxis={"autorange": "reversed"}, height=120 + 45 * n, margin={"l": 60, "r": 20, "t": 70, "b": 40})
    return fig
