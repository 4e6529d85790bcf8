"""The serving engine's explorer: the scheduler replayed on a fitted step cost, moved by sliders.

``engine_explorer(cost, ...)``: a seeded Poisson trace served by the engine's own scheduler on the clock of
``cost`` (``predict.serving.engine.simulate_serving``: no ranks, an answer in milliseconds). Sliders for the
request rate, the block size (the cache keeps the same number of token slots), the token budget per step,
and chunked prefill on or off; it shows TTFT, TPOT, the longest gap, throughput, preemptions and the KV
slots real tokens hold, and each request's timeline.
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.core.serving.requests import EngineConfig
from shardlib.lab.serving.traces import poisson_trace
from shardlib.predict.serving.engine import paged_utilization, simulate_serving
from shardlib.ui.engine_figures import token_timeline_figure
from shardlib.ui.live import FigureArea, slider, wire

RATES = (("5 / s", 5.0), ("10 / s", 10.0), ("20 / s", 20.0), ("50 / s", 50.0), ("100 / s", 100.0),
         ("200 / s", 200.0), ("all at once", float("inf")))
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)
BUDGETS = (16, 32, 64, 128, 256)


def html_table(rows) -> str:
    """Rows of cells as an HTML table, every cell after the first in bold."""
    return ("<table style='font-size:12px'>" + "".join(
        "<tr>" + "".join(f"<td style='padding-right:14px'>{'<b>' if i else ''}{html.escape(str(c))}"
                         f"{'</b>' if i else ''}</td>" for i, c in enumerate(row)) + "</tr>"
        for row in rows) + "</table>")


def explorer_state(cost, rate_per_s: float, block_size: int, max_batch_tokens: int, chunked: bool,
                   n_requests: int = 24, cache_tokens: int = 512, max_positions: int = 128, seed: int = 7):
    """``(requests, config, predicted)`` for one setting of the explorer's controls; a ValueError in words
    when the setting cannot serve the trace."""
    requests = poisson_trace(n_requests, rate_per_s, prompt_tokens=(4, 40), new_tokens=(2, 24), seed=seed)
    config = EngineConfig(block_size=block_size, num_blocks=cache_tokens // block_size,
                          max_batch_tokens=max_batch_tokens, chunked_prefill=chunked)
    problems = config.problems(requests, max_positions)
    if problems:
        raise ValueError(problems[0])
    return requests, config, simulate_serving(requests, config, cost)


def engine_explorer(cost, n_requests: int = 24, cache_tokens: int = 512, max_positions: int = 128,
                    seed: int = 7, where: str = "") -> widgets.VBox:
    """The explorer over ``cost`` (a ``StepCost``, e.g. the one fitted to your run)."""
    rate = slider(RATES, 20.0, "request rate")
    block = slider(BLOCK_SIZES, 16, "block size (tokens)")
    budget = slider(BUDGETS, 64, "token budget per step")
    chunked = widgets.ToggleButtons(options=(("chunked prefill", True), ("prefill-first", False)), value=True)
    table = widgets.HTML()
    figure = FigureArea()

    def update(change=None) -> None:
        requests, config, predicted = explorer_state(cost, rate.value, block.value, budget.value, chunked.value,
                                                     n_requests, cache_tokens, max_positions, seed)
        f = predicted.figures(requests)
        rows = [("simulated", f"{rate.label} requests, blocks of {block.value} tokens, a budget of {budget.value} "
                              f"tokens a step, {'chunked prefill' if chunked.value else 'prefill-first'}"),
                ("TTFT p50 / p90", f"{f['ttft_p50_s'] * 1e3:.1f} / {f['ttft_p90_s'] * 1e3:.1f} ms"),
                ("TPOT p50 / p90", f"{f['tpot_p50_s'] * 1e3:.2f} / {f['tpot_p90_s'] * 1e3:.2f} ms"),
                ("longest gap between two tokens", f"{f['gap_max_s'] * 1e3:.1f} ms"),
                ("throughput", f"{f['tokens_per_s']:.0f} tokens/s"),
                ("preemptions", f"{predicted.preemptions}"),
                ("KV slots holding real tokens", f"{paged_utilization(requests, config.block_size):.1%} "
                                                 f"({config.num_blocks} blocks of {config.block_size})")]
        table.value = html_table(rows)
        new = token_timeline_figure(requests, predicted.token_times_s, "Predicted: each request's wait and tokens",
                                    where)
        figure.show(new)

    area = wire((rate, block, budget, chunked), update)
    return widgets.VBox([widgets.HBox([rate, block]), widgets.HBox([budget, chunked]), area, table, figure])
