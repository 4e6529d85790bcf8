"""The suite's one palette: every figure colours ranks, microbatches, operations and kinds of span from it."""

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
