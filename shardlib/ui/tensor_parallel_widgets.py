"""Widgets of tensor parallelism: the two cut orders on live ranks, and what each degree costs a model."""

from __future__ import annotations

import html

import ipywidgets as widgets

from shardlib.core.toy import generator, weight
from shardlib.facts.models import PRESETS
from shardlib.lab.tensor_parallel.drivers import run_pair
from shardlib.predict.shapes import (
    kv_cache_bytes,
    kv_head_copies,
    kv_heads_per_device,
    padded_vocab_size,
    tensor_parallel_problems,
    usable_tensor_parallel_degrees,
    vocab_padding_bytes,
)
from shardlib.predict.tensor_parallel import CUTS, pair_collectives, pair_wire_collectives
from shardlib.ui.live import wire
from shardlib.ui.theme import GREEN, RED


def tp_cut_explorer(ranks, tokens: int = 12, d_model: int = 64, d_hidden: int = 256) -> widgets.VBox:
    """Pick a shard count (1 to 8) and a cut order; see the collectives and bytes of one pair, predicted,
    and measured on the live ranks when the shard count equals the pool's size."""
    shards = widgets.IntSlider(value=ranks.world_size, min=1, max=8, description="shards")
    cut = widgets.ToggleButtons(options=list(CUTS), value=CUTS[0], description="cut")
    out = widgets.HTML()
    g = generator(0)
    x = weight(g, tokens, d_model, scale=d_model ** 0.5)[None]  # (1, tokens, d_model), unit variance
    w1, w2 = weight(g, d_hidden, d_model), weight(g, d_model, d_hidden)

    def show(change=None) -> None:
        predicted = pair_collectives(cut.value, shards.value, tokens, d_model, d_hidden)
        wire = pair_wire_collectives(cut.value, shards.value, tokens, d_model, d_hidden)
        rows = ([f"<tr><td>{op}</td><td>{size:,} buffer bytes</td><td>{w:,} wire bytes per rank</td></tr>"
                 for (op, size), (_, w) in zip(predicted, wire)]
                or ["<tr><td colspan=3>none: one shard holds everything</td></tr>"])
        text = (f"<b>{cut.value}, {shards.value} shard(s)</b>, {tokens} tokens, d_model {d_model}, hidden {d_hidden}"
                f"<br>predicted per pair: {len(predicted)} collective(s), {sum(s for _, s in predicted):,} buffer "
                f"bytes, {sum(w for _, w in wire):,} wire bytes per rank (ring)<table>{''.join(rows)}</table>")
        if shards.value == ranks.world_size:
            run = run_pair(ranks, cut.value, x, w1, w2)
            same = run.measured == run.predicted and run.measured_wire == run.predicted_wire
            text += (f"measured on rank 0 of the live pool: {len(run.measured)} collective(s), "
                     f"{run.measured_bytes:,} buffer bytes, {run.measured_wire_bytes:,} wire bytes "
                     f"{'(matches)' if same else '(DIFFERS)'}")
        else:
            text += f"<i>live measurement: set shards to {ranks.world_size}, the size of the running pool</i>"
        out.value = text

    return widgets.VBox([shards, cut, out, wire([shards, cut], show)])


def tp_wall_picker(tp: int = 8, context_tokens: int = 8192) -> widgets.VBox:
    """Pick a model and a tensor-parallel degree; see whether its shapes allow it and, when they do, what
    it costs: KV heads per GPU (copied past their count), one sequence's KV cache per GPU, the padded
    vocabulary. Arithmetic on the model's shapes, not a measurement."""
    model = widgets.Dropdown(options=list(PRESETS), value="Llama-3-70B", description="model")
    degree = widgets.IntSlider(value=tp, min=1, max=32, description="tp")
    out = widgets.HTML()

    def show(change=None) -> None:
        m, t = PRESETS[model.value], degree.value
        problems = tensor_parallel_problems(m, t)
        if problems:
            verdict = f"<b style='color:{RED}'>refused</b>: " + "; ".join(html.escape(p) for p in problems)
        else:
            copies = kv_head_copies(m, t)
            kv = kv_cache_bytes(m, context_tokens, tp=t)
            verdict = (f"<b style='color:{GREEN}'>allowed</b>: {kv_heads_per_device(m, t):g} KV head(s) per GPU"
                       + (f", each copied on {copies} GPUs (the KV cache stops shrinking)" if copies > 1 else "")
                       + f"; KV cache of one {context_tokens:,}-token sequence {kv / 1e6:,.0f} MB per GPU; "
                       f"vocabulary padded to {padded_vocab_size(m, t):,} (+{vocab_padding_bytes(m, t) / 1e6:,.1f} "
                       "MB in all)")
        out.value = (f"{m.name}: {m.n_heads} query heads, {m.n_kv_heads} KV heads, d_ff {m.d_ff}, vocab "
                     f"{m.vocab_size}<br>usable tp: {usable_tensor_parallel_degrees(m)}<br>tp = {t}: {verdict}"
                     "<br><i>shape arithmetic (a model), not a measurement</i>")

    return widgets.VBox([model, degree, out, wire([model, degree], show)])
