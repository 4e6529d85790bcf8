"""One Gantt builder: bars on rows (ranks or stages) against time, for every timeline the suite draws.

``timeline_figure`` (what each rank did: compute, collectives, waits) and the pipeline's charts (each
forward and backward, coloured by microbatch) both turn their data into ``Bar`` s and draw them here,
so every Gantt chart in the suite reads the same way: one row per rank, time left to right, hover for
the name and the times. ``titled`` puts under a title where its numbers come from (the ranks a
measurement ran on, or that a figure is a model). Plotly only: data in, traces out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import plotly.graph_objects as go

from shardlib.ui.mime import mime_figure


@dataclass(frozen=True)
class Bar:
    """One interval on one row. ``group`` is its legend entry (all bars of a group share it);
    ``colour`` may differ bar by bar (a microbatch's colour); ``pattern`` "/" hatches the group."""

    row: str
    start: float
    end: float
    label: str
    group: str
    colour: str
    pattern: str = ""


def bar_traces(bars: Sequence[Bar], show_legend: bool = True, unit: str = "ms", width: float | None = None) -> list:
    """One horizontal bar trace per group, in the order the groups first appear."""
    traces = []
    for group in dict.fromkeys(b.group for b in bars):
        mine = [b for b in bars if b.group == group]
        pattern = mine[0].pattern
        traces.append(go.Bar(
            orientation="h", name=group, legendgroup=group, showlegend=show_legend,
            y=[b.row for b in mine], base=[b.start for b in mine],
            x=[max(b.end - b.start, 1e-6) for b in mine], width=width,
            marker={"color": [b.colour for b in mine], "pattern": {"shape": pattern, "fgcolor": "white"},
                    "line": {"width": 1 if pattern or width is None else 0, "color": "white"}},
            text=[b.label for b in mine], textposition="inside", insidetextanchor="middle",
            customdata=[[b.label, b.end, b.end - b.start] for b in mine],
            hovertemplate=f"%{{customdata[0]}}: %{{base:.2f}} to %{{customdata[1]:.2f}} {unit} "
                          f"(%{{customdata[2]:.3f}} {unit})<extra>%{{y}}</extra>",
        ))
    return traces


def titled(title: str, where: str = "") -> str:
    """``title`` with ``where`` under it in small type (for a measurement, the ranks it ran on, for example
    ``ranks.description``; for a prediction, the model behind it); ``title`` alone if ``where`` is empty."""
    return f"{title}<br><sup>{where}</sup>" if where else title


def row_axis(rows: Sequence[str]) -> dict:
    """A y axis listing ``rows`` top to bottom in the order given."""
    return {"categoryorder": "array", "categoryarray": list(reversed(list(rows)))}


@mime_figure
def gantt_figure(bars: Sequence[Bar], rows: Sequence[str], title: str, x_title: str = "time (ms)",
                 extra_traces: Sequence = (), where: str = "") -> go.Figure:
    """A Gantt chart of ``bars`` with one row per entry of ``rows`` (top to bottom); ``where`` (``titled``)
    says under the title where it was measured or that it is a model."""
    fig = go.Figure(list(extra_traces) + bar_traces(bars))
    fig.update_layout(title=titled(title, where), barmode="overlay", xaxis_title=x_title, yaxis=row_axis(rows),
                      height=140 + 45 * len(rows), margin={"l": 70, "r": 20, "t": 70 if where else 50, "b": 40},
                      bargap=0.15)
    return fig
