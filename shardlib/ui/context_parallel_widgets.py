"""The sequence-length slider: memory per rank at once, then ring attention re-run on the warm ranks.

Move the slider and the memory bars answer first (one rank holding the whole attention, scores and
all, against one rank of the ring), then the ring runs on the pool at that length: its gap from the
whole-sequence attention, its time against the same attention in one process, the compute of each
rank, and its timeline.
"""

from __future__ import annotations

import html
import time

import ipywidgets as widgets
import torch

from shardlib.core.context_parallel.placement import PLACEMENTS
from shardlib.core.model import attention
from shardlib.lab.context_parallel.drivers import run_ring_attention
from shardlib.predict.context_parallel import AttentionShape, attention_bytes_per_rank
from shardlib.ui.context_parallel_figures import attention_memory_figure
from shardlib.ui.data_parallel_figures import overlap_timeline_figure
from shardlib.ui.live import FigureArea, wire


def _qkv(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int):
    g = torch.Generator().manual_seed(seq)
    return tuple(torch.randn(batch, h, seq, head_dim, generator=g) for h in (heads, kv_heads, kv_heads))


def sequence_explorer(ranks, heads: int = 8, kv_heads: int = 2, head_dim: int = 64, batch: int = 1,
                      max_seq: int = 2048) -> widgets.VBox:
    """A sequence-length slider (multiples of ``4 x ranks``, up to ``max_seq``) and a placement picker,
    wired to causal ring attention on ``ranks``."""
    n = ranks.world_size
    step = 4 * n * 16
    slider = widgets.IntSlider(value=min(4 * step, max_seq), min=step, max=max(step, max_seq), step=step,
                               description="sequence length", continuous_update=False,
                               style={"description_width": "initial"})
    picker = widgets.ToggleButtons(options=list(PLACEMENTS), value="zigzag", description="placement")
    label = widgets.HTML()
    memory, timeline = FigureArea(), FigureArea()

    def show_memory() -> AttentionShape:
        shape = AttentionShape(batch, heads, kv_heads, slider.value, head_dim)
        fig = attention_memory_figure({"one process": attention_bytes_per_rank(shape),
                                       f"ring, {n} ranks": attention_bytes_per_rank(shape, n, picker.value)},
                                      f"What one rank holds at {slider.value:,} tokens (float32, {heads} query "
                                      f"heads, {kv_heads} KV heads)")
        memory.show(fig)
        return shape

    def rerun(change=None) -> None:
        show_memory()  # the formula answers at once; the ranks take a moment
        q, k, v = _qkv(batch, heads, kv_heads, slider.value, head_dim)
        run = run_ring_attention(ranks, q, k, v, True, picker.value)
        start = time.perf_counter()
        attention(q, k, v)
        one_s = time.perf_counter() - start
        cpu = ", ".join(f"{c * 1e3:.0f}" for c in run.compute_cpu_s)
        label.value = (
            f"<b>{slider.value:,} tokens, {picker.value} placement, {n} ranks</b> ({html.escape(ranks.description)}): "
            "largest gap from the "
            f"whole-sequence attention {run.gap:.1e} ({'exact' if run.exact else 'NOT exact'} within 1e-5)<br>"
            f"ring {run.step_s * 1e3:.0f} ms "
            f"against {one_s * 1e3:.0f} ms in this one process (scaled_dot_product_attention, a fused kernel); "
            f"compute per rank {cpu} ms (CPU time); sent per rank {run.sent_bytes_per_rank[0] / 2 ** 20:.2f} MiB")
        timeline.show(overlap_timeline_figure(run.spans, f"The ring at {slider.value:,} tokens, {picker.value} "
                                                         f"placement, measured on {ranks.description}"))

    return widgets.VBox([widgets.HBox([slider, picker]), label, memory, timeline, wire([slider, picker], rerun)])
