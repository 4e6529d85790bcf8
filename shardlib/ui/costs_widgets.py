"""ipywidgets apps for notebook 02: the tensor-parallel cost explorer, and one slow rank on live ranks."""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.core.config import ModelConfig
from shardlib.facts.hardware import LATENCY_CHARGES, LINKS, Link
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.costs.slow_rank import MAX_DELAY_S, run_slow_rank
from shardlib.predict.serving.cost import pipeline_vs_tensor, tp_decode_cost, tp_prefill_cost
from shardlib.predict.shapes import usable_tensor_parallel_degrees
from shardlib.ui.costs_figures import GPU_MODEL, phase_cost_figure, slow_rank_figure
from shardlib.ui.live import FigureArea, SelectionSlider, nearest, wire

PROMPT_CHOICES = tuple(2 ** k for k in range(4, 16))  # 16 .. 32,768 tokens
BATCH_CHOICES = tuple(2 ** k for k in range(0, 9))  # 1 .. 256 sequences
PRESET_NAMES = {link.name for link in LINKS.values()}


def tp_cost_explorer(links: list[Link], model: ModelConfig = LLAMA_3_8B, tp: int = 2,
                     prompt_tokens: int = 2048, batch: int = 1) -> widgets.VBox:
    """Pick a link, a tp degree (only those the model's shapes allow), a prompt length, a batch and the
    latency convention (one latency per all-reduce, or the ring's ``2(n-1)``); see the decode and prefill
    communication split into latency and bandwidth, and the pipeline's communication for the same batch
    beside it. Pure arithmetic: every move answers at once."""
    if not links:
        raise ValueError("tp_cost_explorer needs at least one Link")
    by_name = {link.name: link for link in links}
    usable = [n for n in usable_tensor_parallel_degrees(model) if n > 1] or [1]
    link_box = widgets.Dropdown(options=list(by_name), description="link")
    degree = SelectionSlider(options=usable, value=nearest(tp, usable), description="tp")
    prompt = SelectionSlider(options=PROMPT_CHOICES, value=nearest(prompt_tokens, PROMPT_CHOICES), description="prompt")
    batch_box = SelectionSlider(options=BATCH_CHOICES, value=nearest(batch, BATCH_CHOICES), description="batch")
    charge = widgets.ToggleButtons(options=list(LATENCY_CHARGES), value="per_call", description="latency")
    text = widgets.HTML()
    fig = FigureArea()

    def show(change=None) -> None:
        link = by_name[link_box.value]
        decode = tp_decode_cost(model, degree.value, link, batch_box.value, charge.value)
        prefill = tp_prefill_cost(model, degree.value, link, prompt.value, batch_box.value, charge.value)
        pipe = pipeline_vs_tensor(model, degree.value, link, prompt.value * batch_box.value, charge.value)
        where = GPU_MODEL if link.name in PRESET_NAMES else f"model: alpha-beta with {link.name}'s fitted figures"
        fig.show(phase_cost_figure([decode, prefill], where=where))
        latencies = 1 if charge.value == "per_call" else 2 * (degree.value - 1)
        text.value = (
            f"<b>{html.escape(model.name)} on {html.escape(link.name)}, tp = {degree.value}</b>, {decode.collectives} "
            f"all-reduces per forward pass, each paying {latencies} latenc{'y' if latencies == 1 else 'ies'} "
            f"({'one per call' if charge.value == 'per_call' else 'one per ring step'})<br>"
            f"decode step ({batch_box.value} token(s), {decode.size_bytes:,} bytes each): "
            f"<b>{decode.total_s * 1e6:,.0f} us</b>, {decode.bound}-bound<br>"
            f"prefill ({batch_box.value} x {prompt.value:,} tokens, {prefill.size_bytes:,} bytes each): "
            f"<b>{prefill.total_s * 1e3:,.2f} ms</b>, {prefill.bound}-bound<br>"
            f"the same prefill cut into {degree.value} pipeline stages instead: {pipe.pipeline_transfers} "
            f"point-to-point send(s), {pipe.pipeline_bytes / 1e6:,.1f} MB and {pipe.pipeline_s * 1e3:,.2f} ms, "
            f"against {pipe.tensor_bytes / 1e6:,.0f} MB for tensor parallelism")

    area = wire((link_box, degree, prompt, batch_box, charge), show)
    return widgets.VBox([link_box, degree, prompt, batch_box, charge, text, fig, area])


def slow_rank_explorer(ranks, delay_ms: int = 50) -> widgets.VBox:
    """Slide the delay of one rank (0 to 200 ms) and pick which rank is slow; each move runs every
    collective of ``SLOW_RANK_OPS`` on the live ranks and shows how long each rank waited inside it."""
    max_ms = int(min(200, MAX_DELAY_S * 1e3))
    delay = widgets.IntSlider(value=min(max(delay_ms, 0), max_ms), min=0, max=max_ms, step=10,
                              description="delay (ms)", continuous_update=False)
    slow = widgets.Dropdown(options=list(range(ranks.world_size)), value=ranks.world_size - 1,
                            description="slow rank")
    text = widgets.HTML()
    fig = FigureArea()

    def run(change=None) -> None:
        delay_s = delay.value / 1e3
        run = run_slow_rank(ranks, slow.value, delay_s)
        fig.show(slow_rank_figure(run, f"measured on {ranks.description}"))
        steps = [max(run.steps_s(op)) for op in run.ops]
        text.value = (f"rank {slow.value} sleeps {delay.value} ms before each collective; every rank's step took "
                      f"{min(steps) * 1e3:.1f} to {max(steps) * 1e3:.1f} ms")

    return widgets.VBox([delay, slow, text, fig, wire([delay, slow], run)])
