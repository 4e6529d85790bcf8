"""The suite's one palette: every figure colours ranks, microbatches, operations and kinds of span from it,
and owner maps (which rank or shard holds each cell) with ``owner_heatmap``."""

from __future__ import annotations

# Tableau 10: distinct, readable on white, and kind to the common forms of colour blindness.
PALETTE = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#eeca3b", "#b279a2", "#ff9da6", "#9d755d",
           "#bab0ac")
BLUE, ORANGE, GREEN, RED, TEAL, YELLOW, PURPLE, PINK, BROWN, GREY = PALETTE
WAIT_COLOUR = "#d9d9d9"  # time spent waiting for a message
LIGHT_BLUE, DARK_GREY, GUIDE_GREY, LABEL_GREY = "#9ecae9", "#79706e", "#888888", "#555555"
RIGHT_COLOUR, WRONG_COLOUR, MUTED_COLOUR = "#1a7f37", "#b35900", "#57606a"  # feedback text

KIND_COLOURS = {"compute": BLUE, "comm": ORANGE, "wait": GREY, "send": GREEN, "recv": PURPLE}
OP_COLOURS = {"all_reduce": BLUE, "all_to_all": ORANGE, "point_to_point": GREEN, "all_gather": RED,
              "reduce_scatter": TEAL, "barrier": PURPLE}


def colour(i: int) -> str:
    """The ``i``-th colour of the palette (rank ``i``, microbatch ``i``, series ``i``), cycling."""
    return PALETTE[i % len(PALETTE)]


def colours(n: int) -> list[str]:
    """The first ``n`` colours, cycling."""
    return [colour(i) for i in range(n)]


def owner_heatmap(z, n: int, hovertemplate: str, showscale: bool, owner: str = "rank", **kwargs):
    """A heatmap of owners ``0 .. n-1`` (ranks or shards), each cell in its owner's palette colour."""
    import plotly.graph_objects as go

    scale = [[k / (n - 1), c] for k, c in enumerate(colours(n))] if n > 1 else [[0, colour(0)], [1, colour(0)]]
    return go.Heatmap(z=z, colorscale=scale, zmin=0, zmax=max(n - 1, 1), showscale=showscale,
                      colorbar={"title": owner, "tickvals": list(range(n))}, hovertemplate=hovertemplate, **kwargs)
