"""The strategy picker and the bucket-size slider: each move trains the toy on the warm ranks and
redraws what one rank keeps, what it sent, and the timeline of one step."""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.core.checks import TOLERANCE
from shardlib.core.data_parallel.flat import STRATEGY_TITLES
from shardlib.core.mesh import DP_STRATEGIES
from shardlib.lab.data_parallel.claims import OPS
from shardlib.lab.data_parallel.drivers import run_data_parallel
from shardlib.lab.data_parallel.reference import train_one_process
from shardlib.predict.data_parallel import MEMORY_KEYS
from shardlib.runtime.records import format_seconds
from shardlib.ui.data_parallel_figures import overlap_timeline_figure, strategy_bars_figure
from shardlib.ui.live import FigureArea, slider, wire

ONE_BUCKET = 0  # the slider's value for "one bucket" (bucket_bytes=None): a slider option is never None
BUCKET_CHOICES = (("1 KiB", 1024), ("4 KiB", 4096), ("16 KiB", 16384), ("64 KiB", 65536), ("one bucket", ONE_BUCKET))


def strategy_explorer(ranks, model, batches, lr: float = 1e-2, bucket_bytes: int | None = 4096) -> widgets.VBox:
    """Pick a strategy, a bucket size and overlap on or off: ``model`` trains on ``batches`` on the warm
    ``ranks`` and the figures show what rank 0 kept and sent, measured beside predicted, and the last
    step's timeline. It starts with the picked strategy's bars only; each strategy's bars appear when it
    is first picked (one training run per move, none spent in advance)."""
    picker = widgets.ToggleButtons(options=[(STRATEGY_TITLES[s], s) for s in DP_STRATEGIES], value="ddp",
                                   description="strategy")
    start = ONE_BUCKET if bucket_bytes is None else bucket_bytes
    buckets = slider(BUCKET_CHOICES, start, "bucket size")
    overlap = widgets.Checkbox(value=True, description="overlap with compute", indent=False)
    summary = widgets.HTML()
    memory_fig, bytes_fig, timeline = FigureArea(), FigureArea(), FigureArea()
    measured_memory, predicted_memory = {s: {} for s in DP_STRATEGIES}, {s: 0 for s in DP_STRATEGIES}
    measured_bytes, predicted_bytes = {s: {} for s in DP_STRATEGIES}, {s: 0 for s in DP_STRATEGIES}
    one_process = train_one_process(model, batches, lr)

    def show(change=None, strategy: str | None = None) -> None:
        s = strategy or picker.value
        buckets.disabled = s == "zero3"  # ZeRO-3 communicates per layer, not per bucket
        run = run_data_parallel(ranks, s, model, batches, lr, bucket_bytes=buckets.value or None, overlap=overlap.value,
                                  prefetch=overlap.value)
        measured_memory[s], predicted_memory[s] = run.memory_per_rank[0], run.predicted_memory()
        measured_bytes[s] = {op: row["wire_bytes"] for op, row in run.bytes_per_step().items()}
        predicted_bytes[s] = sum(row["wire_bytes"] for row in run.predicted_bytes_per_step().values())
        memory_fig.show(strategy_bars_figure(measured_memory, MEMORY_KEYS, predicted_memory).update_layout(width=480))
        sent = strategy_bars_figure(measured_bytes, OPS, predicted_bytes, "Bytes one rank sends per step, by op",
                                    "KiB on the wire (ring convention)")
        bytes_fig.show(sent.update_layout(width=480))
        mem = run.memory_per_rank[0]
        summary.value = (
            f"<b>{html.escape(STRATEGY_TITLES[s])}</b> on {ranks.world_size} live ranks "
            f"({html.escape(ranks.description)}), {len(run.groups)} flat "
            f"{'units' if s == 'zero3' else 'buckets'}, {run.n_params:,} parameters<br>rank 0 keeps params "
            f"{mem['params']:,} B, grads {mem['grads']:,} B, optimizer {mem['optimizer']:,} B (transient peak "
            f"{mem['transient_peak']:,} B); sent {run.wire_bytes_per_step():,} B in the last step (predicted "
            f"{predicted_bytes[s]:,} B)<br>step {format_seconds(run.step_s())}; communication hidden under "
            f"compute {run.hidden_share():.0%}; weights within {TOLERANCE:g} of one process: "
            f"{run.against_reference(one_process) <= TOLERANCE}"
        )
        timeline.show(overlap_timeline_figure(run.spans, f"{STRATEGY_TITLES[s]}: the last step on each rank, "
                                                         f"measured on {ranks.description}", run.n_steps - 1))

    # the first draw shows the strategy picked only: each pick adds its bars, so the comparison is the learner's
    area = wire((picker, buckets, overlap), show)
    return widgets.VBox([picker, widgets.HBox([buckets, overlap]), summary, widgets.HBox([memory_fig, bytes_fig]),
                         timeline, area])
