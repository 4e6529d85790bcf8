"""Figures of a plan: the feasible layouts side by side (data in, ``go.Figure`` out; pure, no processes)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from shardlib.predict.serving.planner import Plan
from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, ORANGE


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
