"""Figures of layouts: the feasible layouts of a plan side by side, a layout's ranks on its grid, and one model cut
three ways (data in, ``go.Figure`` out; pure, no processes)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.stages import split_layers
from shardlib.predict.serving.planner import Plan
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, ORANGE, owner_heatmap


@mime_figure
def plan_figure(p: Plan, top: int = 10) -> go.Figure:
    """Decode throughput (tokens/s, whole cluster) and decode latency (ms per token) of the best
    ``top`` feasible layouts, best first; batch, memory and idle share in the hover text."""
    shown = p.ranked[:top]
    labels = [s.layout.label for s in shown]
    hover = [f"{s.layout.label}<br>batch {s.batch} per replica ({s.batch_set_by})<br>memory/GPU "
             f"{s.memory.total_bytes / 1e9:.2f} GB<br>{s.n_microbatches} microbatch(es), idle {s.idle_fraction:.2f}"
             f"<br>first token {s.first_token_s * 1e3:.1f} ms" for s in shown]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("decode throughput (tokens/s)", "decode latency (ms/token)"))
    colors = [BLUE if i else ORANGE for i in range(len(shown))]
    fig.add_bar(x=labels, y=[s.tokens_per_s for s in shown], marker_color=colors, hovertext=hover,
                hoverinfo="text", row=1, col=1, showlegend=False)
    fig.add_bar(x=labels, y=[s.decode_step_s * 1e3 for s in shown], marker_color=colors, hovertext=hover,
                hoverinfo="text", row=1, col=2, showlegend=False)
    efficiency = p.workload.kernel_efficiency
    peak = "floors at 100% of peak" if efficiency == 1 else f"kernels at {efficiency:.0%} of peak"
    fig.update_layout(title=f"{p.model.name} on {p.cluster.name}: feasible layouts ranked by {p.objective} "
                            f"(best in orange; {len(p.rejected)} rejected)<br><sup>the planner's model, not a "
                            f"measurement: {peak}</sup>", height=380,
                      margin={"t": 70, "b": 90})
    return fig


@mime_figure
def rank_grid_figure(layout: Layout, gpus_per_node: int | None = None) -> go.Figure:
    """Every rank of ``layout`` placed by ``Layout.position``, the numbering the runs use: a row per pipeline
    stage, a column per (replica, tp rank); each cell its global rank, coloured by replica. With
    ``gpus_per_node``, each cell also names the node the rank's number puts it on (ranks fill nodes in order)."""
    if layout.cp > 1:
        raise ValueError(f"{layout.label}: the grid draws tp, pp and dp; give a layout without context parallelism")
    cols = layout.dp * layout.tp
    z = [[0] * cols for _ in range(layout.pp)]
    text = [[""] * cols for _ in range(layout.pp)]
    for r in range(layout.world_size):
        stage, replica, tp_rank = layout.coords(r)
        node = f"<br>node {r // gpus_per_node}" if gpus_per_node else ""
        z[stage][replica * layout.tp + tp_rank] = replica
        text[stage][replica * layout.tp + tp_rank] = f"rank {r}{node}"
    fig = go.Figure(owner_heatmap(z, layout.dp, "%{y}, %{x}: %{text}<extra></extra>", False, owner="replica",
                                  text=text, texttemplate="%{text}", xgap=3, ygap=3,
                                  x=[f"replica {c // layout.tp}, tp {c % layout.tp}" for c in range(cols)],
                                  y=[f"stage {s}" for s in range(layout.pp)]))
    nodes = f" on {-(-layout.world_size // gpus_per_node)} nodes of {gpus_per_node}" if gpus_per_node else ""
    fig.update_layout(title=f"{layout.label}{nodes}<br><sup>a row: a pipeline stage; a colour: a replica; a tp "
                            "group: one colour's cells in a row; a pipeline: one column</sup>",
                      yaxis={"autorange": "reversed"},
                      height=110 + 70 * layout.pp, margin={"l": 70, "r": 20, "t": 60, "b": 40})
    return fig


@mime_figure
def three_cuts_figure(n_layers: int, n_experts: int, devices: int) -> go.Figure:
    """One MoE model's pieces over ``devices``, cut three ways: tensor parallelism gives every device a slice of
    every layer; pipeline parallelism whole layers (``split_layers``, as the stages run them); expert
    parallelism whole experts (``ExpertPlacement``), the attention copied. A cell's colour is its device."""
    stages = split_layers(n_layers, devices)
    hosts = ExpertPlacement(n_experts, devices)
    cuts = {"tensor: a slice of every layer": ([f"slice {j}" for j in range(devices)],
                                               [list(range(devices)) for _ in range(n_layers)]),
            "pipeline: whole layers": (["whole layer"], [[next(s for s, run in enumerate(stages) if i in run)]
                                                         for i in range(n_layers)]),
            "expert: whole experts": ([f"expert {e}" for e in range(n_experts)],
                                      [[hosts.owner(e) for e in range(n_experts)] for _ in range(n_layers)])}
    fig = make_subplots(rows=1, cols=3, subplot_titles=tuple(cuts), horizontal_spacing=0.06,
                        column_widths=[1, 1, 1])
    for col, (x, z) in enumerate(cuts.values(), start=1):
        fig.add_trace(owner_heatmap(z, devices, "%{y}, %{x}: device %{z}<extra></extra>", False, owner="device",
                                    xgap=2, ygap=2, x=x, y=[f"layer {i}" for i in range(n_layers)]), row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"One model cut three ways over {devices} devices: each holds 1/{devices} (colour: the "
                            f"device)<br><sup>{n_layers} layers of {n_experts} experts; attention, not drawn, is "
                            "sliced under TP, whole in its stage under PP, copied under EP</sup>",
                      height=150 + 28 * n_layers,
                      margin={"l": 60, "r": 20, "t": 80, "b": 40})
    return fig
