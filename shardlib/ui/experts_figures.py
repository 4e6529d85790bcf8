"""Plotly figures for expert parallelism: data in, ``go.Figure`` out.

The step-through of one MoE layer (router, dispatch, expert FFN, combine, the stall), the all-to-all
send matrix, the load on each expert, and the measured time of each rank. Pure: no torch, no widgets,
no processes; the numbers come from the router and the live runs of ``shardlib.lab.experts``.
"""

from __future__ import annotations

from typing import Sequence

import plotly.graph_objects as go

from shardlib.ui.mime import mime_figure
from shardlib.ui.theme import BLUE, DARK_GREY, GREY, LIGHT_BLUE, RED, colour

STAGES = (
    "1 · The router picks the top-k experts for each token",
    "2 · Dispatch: an all-to-all ships each token to its experts' ranks",
    "3 · Each expert runs its FFN on the rows it received",
    "4 · Combine: a second all-to-all brings the results home, weighted by the gates",
    "5 · One overloaded expert stalls everyone: the step ends when the busiest rank does",
)


@mime_figure
def walkthrough_figure(home_rank: Sequence[int], experts: Sequence[Sequence[int]], gates: Sequence[Sequence[float]],
                       owner: Sequence[int]) -> go.Figure:
    """The MoE layer as a five-step animation (press play, or drag the slider).

    ``home_rank[t]`` is token ``t``'s rank, ``experts[t]`` its chosen experts and ``gates[t]`` their
    weights, ``owner[e]`` the rank holding expert ``e``: the router's real decisions for a few tokens.
    """
    n_tokens, n_experts = len(home_rank), len(owner)
    if len(experts) != n_tokens or len(gates) != n_tokens:
        raise ValueError(f"{n_tokens} home ranks but {len(experts)} expert rows and {len(gates)} gate rows")
    n_ranks = max(max(home_rank), max(owner)) + 1
    band = max(max(home_rank.count(r) for r in range(n_ranks)), max(list(owner).count(r) for r in range(n_ranks)), 1)
    top = {r: -r * (band + 1.5) for r in range(n_ranks)}  # each rank's horizontal band, top edge
    local = {t: [u for u in range(n_tokens) if home_rank[u] == home_rank[t]].index(t) for t in range(n_tokens)}
    token_y = [top[home_rank[t]] - local[t] for t in range(n_tokens)]
    hosted = {r: [e for e in range(n_experts) if owner[e] == r] for r in range(n_ranks)}
    expert_y = [top[owner[e]] - (hosted[owner[e]].index(e) + 0.5) * band / len(hosted[owner[e]]) + 0.5
                for e in range(n_experts)]
    copies = [(t, s, e) for t in range(n_tokens) for s, e in enumerate(experts[t])]
    load = [sum(1 for _, _, e in copies if e == x) for x in range(n_experts)]
    rank_rows = [sum(load[e] for e in hosted[r]) for r in range(n_ranks)]
    busiest = max(rank_rows) or 1
    slot_at = [sum(1 for _, _, f in copies[:i] if f == e) for i, (_, _, e) in enumerate(copies)]  # in its grid
    per_row = 4

    def at_expert(i: int) -> tuple[float, float]:
        e, j = copies[i][2], slot_at[i]
        rows = (load[e] + per_row - 1) // per_row
        return x_expert - 0.4 - 0.22 * (j % per_row), expert_y[e] + 0.28 * (j // per_row - (rows - 1) / 2)

    labels = [f"t{t}" for t, _, _ in copies]
    colours = [colour(owner[e]) for _, _, e in copies]
    x_home, x_expert, x_back, x_bar = 0.0, 2.5, 5.0, 6.0

    def copies_at(stage: int) -> go.Scatter:
        if stage == 0:
            xs, ys, text = [x_home + 0.35 * s for _, s, _ in copies], [token_y[t] for t, _, _ in copies], labels
        elif stage in (1, 2):
            xs, ys = zip(*(at_expert(i) for i in range(len(copies))))
            text = [""] * len(copies)
        else:
            xs, ys, text = [x_back + 0.35 * s for _, s, _ in copies], [token_y[t] for t, _, _ in copies], labels
        hover = [f"t{t} -> expert {e} (rank {owner[e]}), gate {gates[t][s]:.2f}" for t, s, e in copies]
        return go.Scatter(x=list(xs), y=list(ys), mode="markers+text", text=text, textposition="middle left",
                          marker={"size": 11, "color": colours, "line": {"width": 1, "color": "white"}},
                          hovertext=hover, hoverinfo="text", name="token rows")

    def routes(stage: int, crossing: bool) -> go.Scatter:
        xs, ys = [], []
        if stage in (0, 1, 3):
            for i, (t, s, e) in enumerate(copies):
                if (owner[e] != home_rank[t]) != crossing:
                    continue
                ex, ey = at_expert(i) if stage == 1 else (x_expert - 0.4, expert_y[e])
                if stage < 3:
                    xs += [x_home + 0.35 * s, ex, None]
                    ys += [token_y[t], ey, None]
                else:
                    xs += [x_expert, x_back + 0.35 * s, None]
                    ys += [expert_y[e], token_y[t], None]
        colour = "rgba(228,87,86,0.7)" if crossing else "rgba(120,120,120,0.45)"
        return go.Scatter(x=xs or [None], y=ys or [None], mode="lines", hoverinfo="skip",
                          name="crosses to another rank" if crossing else "stays on its rank",
                          line={"color": colour, "width": 1.5 if crossing else 1,
                                "dash": "dot" if stage == 0 else "solid"})

    def expert_boxes(stage: int) -> go.Scatter:
        size = [22 + (26 * load[e] / max(max(load), 1) if stage >= 2 else 0) for e in range(n_experts)]
        hot = max(range(n_experts), key=lambda e: load[e])
        line = [3 if (stage == 4 and e == hot) else 1 for e in range(n_experts)]
        return go.Scatter(x=[x_expert] * n_experts, y=expert_y, mode="markers+text",
                          text=[f"E{e}" + (f" ({load[e]})" if stage >= 2 else "") for e in range(n_experts)],
                          textposition="middle right",
                          marker={"symbol": "square", "size": size,
                                  "color": [colour(owner[e]) for e in range(n_experts)],
                                  "opacity": 0.55, "line": {"width": line, "color": "#222"}},
                          hoverinfo="text",
                          hovertext=[f"expert {e} on rank {owner[e]}: {load[e]} rows" for e in range(n_experts)],
                          name="experts")

    def bar_y(r: int) -> float:
        return top[r] - band / 2 + 0.5

    def busy(stage: int) -> go.Scatter:
        xs, ys, text = [], [], []
        if stage >= 2:
            for r in range(n_ranks):
                xs += [x_bar, x_bar + 2.0 * rank_rows[r] / busiest, None]
                ys += [bar_y(r), bar_y(r), None]
                text += [f"{rank_rows[r]} rows", "", ""]
        return go.Scatter(x=xs or [None], y=ys or [None], text=text or [""], mode="lines+text", name="expert work",
                          textposition="bottom right", line={"width": 14, "color": DARK_GREY}, hoverinfo="skip")

    def waiting(stage: int) -> go.Scatter:
        xs, ys = [], []
        if stage == 4:
            for r in range(n_ranks):
                if rank_rows[r] < busiest:
                    xs += [x_bar + 2.0 * rank_rows[r] / busiest, x_bar + 2.0, None]
                    ys += [bar_y(r), bar_y(r), None]
        return go.Scatter(x=xs or [None], y=ys or [None], mode="lines", name="idle, waiting",
                          line={"width": 14, "color": "rgba(228,87,86,0.3)"}, hoverinfo="skip")

    def wait_line(stage: int) -> go.Scatter:
        if stage != 4:
            return go.Scatter(x=[None], y=[None], mode="lines", name="everyone waits until here")
        y0, y1 = top[n_ranks - 1] - band, top[0] + 0.8
        return go.Scatter(x=[x_bar + 2.0, x_bar + 2.0], y=[y0, y1], mode="lines", name="everyone waits until here",
                          line={"color": RED, "dash": "dash", "width": 2})

    def traces(stage: int) -> list:
        return [routes(stage, False), routes(stage, True), expert_boxes(stage), copies_at(stage), busy(stage),
                waiting(stage), wait_line(stage)]

    frames = [go.Frame(data=traces(i), name=str(i), layout={"title": {"text": STAGES[i]}}) for i in range(len(STAGES))]
    fig = go.Figure(data=traces(0), frames=frames)
    annotations = [dict(x=-0.9, y=top[r] - band / 2 + 0.5, text=f"<b>rank {r}</b>", showarrow=False, textangle=-90,
                        font={"color": colour(r)}) for r in range(n_ranks)]
    annotations += [dict(x=x, y=top[0] + 1.2, text=t, showarrow=False) for x, t in
                    ((x_home, "home: tokens"), (x_expert, "experts"), (x_back, "home: outputs"),
                     (x_bar + 1.0, "expert rows per rank"))]
    step = {"frame": {"duration": 1400, "redraw": True}, "transition": {"duration": 500}}
    fig.update_layout(
        title=STAGES[0], height=170 + 38 * n_ranks * (band + 1.5), showlegend=False, annotations=annotations,
        xaxis={"visible": False, "range": [-1.2, x_bar + 2.6]}, yaxis={"visible": False},
        margin={"l": 20, "r": 20, "t": 60, "b": 20},
        updatemenus=[{"type": "buttons", "showactive": False, "x": 0.0, "y": -0.02, "xanchor": "left",
                      "buttons": [{"label": "play", "method": "animate", "args": [None, {**step, "fromcurrent": True}]},
                                  {"label": "pause", "method": "animate",
                                   "args": [[None], {"frame": {"duration": 0}, "mode": "immediate"}]}]}],
        sliders=[{"active": 0, "x": 0.15, "len": 0.85, "y": -0.02, "currentvalue": {"visible": False},
                  "steps": [{"label": str(i + 1), "method": "animate",
                             "args": [[str(i)], {"mode": "immediate", **step}]} for i in range(len(STAGES))]}],
    )
    return fig


@mime_figure
def send_matrix_figure(send_matrix: Sequence[Sequence[int]],
                       title: str = "All-to-all dispatch: token rows from rank i to rank j") -> go.Figure:
    """A heatmap of rows sent from each rank (row) to each rank (column), the count in each cell."""
    n = len(send_matrix)
    if n == 0 or any(len(row) != n for row in send_matrix):
        raise ValueError(f"the send matrix must be square (one row and one column per rank), got {send_matrix!r}")
    labels = [f"rank {r}" for r in range(n)]
    fig = go.Figure(go.Heatmap(z=[list(row) for row in send_matrix], x=labels, y=labels, colorscale="Blues", zmin=0,
                               text=[[str(v) for v in row] for row in send_matrix], texttemplate="%{text}",
                               colorbar={"title": "rows"},
                               hovertemplate="from %{y} to %{x}: %{z} rows<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="to (expert's rank)", yaxis_title="from (token's home)",
                      yaxis={"autorange": "reversed"}, height=260 + 30 * n, width=360 + 40 * n)
    return fig


@mime_figure
def expert_load_figure(counts: Sequence[int], owner: Sequence[int], capacity_total: int | None = None,
                       title: str = "Token-slots each expert serves") -> go.Figure:
    """Bars of each expert's load, coloured by the rank that holds it, with the even share (mean) and,
    when a capacity factor is set, the most it may take in total."""
    if len(counts) != len(owner):
        raise ValueError(f"{len(counts)} loads but {len(owner)} owners: one of each per expert")
    fig = go.Figure(go.Bar(x=[f"E{e}" for e in range(len(counts))], y=list(counts),
                           marker_color=[colour(r) for r in owner], text=[str(c) for c in counts],
                           textposition="outside", customdata=list(owner),
                           hovertemplate="%{x} on rank %{customdata}: %{y} token-slots<extra></extra>"))
    mean = sum(counts) / len(counts) if counts else 0
    fig.add_hline(y=mean, line_dash="dot", line_color="#444", annotation_text=f"even share {mean:.0f}",
                  annotation_position="top left")
    if capacity_total is not None:
        fig.add_hline(y=capacity_total, line_dash="dash", line_color=RED,
                      annotation_text=f"capacity {capacity_total}", annotation_position="top right")
    fig.update_layout(title=title, yaxis_title="token-slots", height=330, showlegend=False)
    return fig


@mime_figure
def rank_time_figure(expert_s: Sequence[float], forward_s: Sequence[float], step_s: float,
                     expert_cpu_s: Sequence[float] | None = None,
                     title: str = "Measured time on each rank") -> go.Figure:
    """Per rank: the wall-clock time its experts computed (and, if given, their CPU time), and its whole
    forward; a dashed line at the step time (first rank's start to last rank's end)."""
    if len(expert_s) != len(forward_s) or (expert_cpu_s is not None and len(expert_cpu_s) != len(expert_s)):
        raise ValueError(f"{len(expert_s)} expert times but {len(forward_s)} forward times"
                         + ("" if expert_cpu_s is None else f" and {len(expert_cpu_s)} CPU times")
                         + ": one of each per rank")
    ranks = [f"rank {r}" for r in range(len(expert_s))]
    bars = [go.Bar(name="expert FFN (wall clock)", x=ranks, y=[s * 1e3 for s in expert_s], marker_color=BLUE,
                   hovertemplate="%{x}: experts %{y:.2f} ms<extra></extra>")]
    if expert_cpu_s is not None:
        bars.append(go.Bar(name="expert FFN (CPU time)", x=ranks, y=[s * 1e3 for s in expert_cpu_s],
                           marker_color=LIGHT_BLUE, hovertemplate="%{x}: experts %{y:.2f} ms of CPU<extra></extra>"))
    bars.append(go.Bar(name="whole forward (route, dispatch, experts, combine)", x=ranks,
                       y=[s * 1e3 for s in forward_s], marker_color=GREY,
                       hovertemplate="%{x}: forward %{y:.2f} ms<extra></extra>"))
    fig = go.Figure(bars)
    fig.add_hline(y=step_s * 1e3, line_dash="dash", line_color=RED, annotation_text=f"step {step_s * 1e3:.1f} ms",
                  annotation_position="top left")
    fig.update_layout(title=title, barmode="group", yaxis_title="ms", height=330,
                      legend={"orientation": "h", "y": -0.2})
    return fig


@mime_figure
def balance_steps_figure(series: dict[str, Sequence[float]],
                         title: str = "Max/mean: the busiest expert's load over the mean, step by step") -> go.Figure:
    """One line per balancing method: the busiest expert's token-slots over the mean at each training
    step (1 is perfectly even), with a dotted line at 1."""
    if not series:
        raise ValueError("balance_steps_figure needs at least one series of loads per step")
    fig = go.Figure()
    for i, (name, ys) in enumerate(series.items()):
        fig.add_trace(go.Scatter(x=list(range(1, len(ys) + 1)), y=list(ys), mode="lines+markers", name=name,
                                 line={"color": colour(i)},
                                 hovertemplate=f"{name}, step %{{x}}: max/mean %{{y:.2f}}<extra></extra>"))
    fig.add_hline(y=1, line_dash="dot", line_color=DARK_GREY, annotation_text="even",
                  annotation_position="bottom right")
    fig.update_layout(title=title, xaxis_title="training step", yaxis_title="max / mean (busiest expert)", height=340,
                      yaxis={"rangemode": "tozero"}, legend={"orientation": "h", "y": -0.25})
    return fig
