"""Widgets of notebook 00: an all-reduce on live ranks, its time against its size."""

from __future__ import annotations

import ipywidgets as widgets

from shardlib.lab.intro.drivers import run_all_reduce_time
from shardlib.ui.live import FigureArea, wire
from shardlib.ui.runtime_figures import measured_points_figure

MIN_LOG2_ELEMENTS, MAX_LOG2_ELEMENTS = 4, 22  # 64 B .. 16 MiB of float32


def all_reduce_explorer(ranks, log2_elements: int = 10) -> widgets.VBox:
    """Slide the message size; each move runs a real all-reduce on the warm ranks and plots it.

    The slider is clamped to 2**4 .. 2**22 float32 elements (64 bytes to 16 MiB) so one move stays
    well under a second even with four ranks on two cores.
    """
    slider = widgets.IntSlider(
        value=min(max(log2_elements, MIN_LOG2_ELEMENTS), MAX_LOG2_ELEMENTS),
        min=MIN_LOG2_ELEMENTS, max=MAX_LOG2_ELEMENTS, description="log2(elements)",
        continuous_update=False, style={"description_width": "initial"},
    )
    label = widgets.HTML()
    fig = FigureArea()
    seen: dict[int, float] = {}

    def measure(change=None) -> None:
        n_elements = 2 ** slider.value
        timing = run_all_reduce_time(ranks, n_elements)
        seconds, size_bytes = timing.seconds, timing.size_bytes  # the slowest rank's median; float32
        seen[size_bytes] = seconds
        xs = sorted(seen)
        fig.show(measured_points_figure(
            xs, [seen[x] * 1e3 for x in xs], "message size (bytes)", "all-reduce time (ms, slowest rank)",
            f"All-reduce on {ranks.world_size} live ranks", where=f"measured on {ranks.description}"))
        label.value = (f"<b>{size_bytes:,} bytes</b>: {seconds * 1e3:.3f} ms, "
                       f"{size_bytes / seconds / 1e9:.3f} GB/s of buffer per second")

    return widgets.VBox([slider, label, fig, wire([slider], measure)])
