"""Who holds which layers: ``split_layers`` cuts the stack into contiguous slices, even or counted per
slice; ``layers_of_stage`` gives a stage its chunks' slices; ``stage_layer_counts`` makes the first and
last stage lighter by the work they do besides the layers (the embedding, the output layer and loss), as
Llama 3 405B's 126 layers on 16 stages (Llama 3 paper, section 3.3.2). Pure: no torch.
"""

from __future__ import annotations

from typing import Sequence

from shardlib.core.checks import near_equal_parts, whole_number
from shardlib.core.pipeline.schedules import Schedule


def stage_layer_counts(n_layers: int, n_stages: int, end_layers: int = 0) -> tuple[int, ...]:
    """Layers per stage, as even as whole layers allow when the first and last stage each carry
    ``end_layers`` layers' worth of other work (the embedding on the first, the output layer and the loss
    on the last) and hold that many layers fewer. Llama 3 405B: 126 layers on 16 stages with
    ``end_layers = 1`` gives ``(7, 8, ..., 8, 7)``, every stage 8 layers' worth (Llama 3 paper, 3.3.2)."""
    n_layers = whole_number(n_layers, "n_layers (layers in the model)")
    n_stages = whole_number(n_stages, "n_stages (pipeline stages)")
    end_layers = whole_number(end_layers, "end_layers", minimum=0)
    counts = list(near_equal_parts(n_layers + 2 * end_layers, n_stages))
    counts[0] -= end_layers
    counts[-1] -= end_layers
    if min(counts) < 1:
        ends = f" with the first and last holding {end_layers} layer(s) fewer" if end_layers else ""
        raise ValueError(f"cannot cut {n_layers} layers into {n_stages} stages{ends}: each stage needs at least one "
                         "whole layer")
    return tuple(counts)


def layers_of_stage(schedule: Schedule, n_layers: int, stage: int, layer_counts=None) -> list[range]:
    """The global layer indices stage ``stage`` holds, one range per model chunk. ``layer_counts``: how
    many layers each virtual stage holds (one count per stage, or per stage and chunk in virtual-stage
    order), or ``None`` to cut as evenly as whole layers allow (``split_layers``)."""
    slices = split_layers(n_layers, schedule.n_virtual_stages, layer_counts)
    return [slices[schedule.virtual_stage_of(stage, c)] for c in range(schedule.n_chunks)]


def split_layers(n_layers: int, n_parts: int, counts: Sequence[int] | None = None) -> tuple[range, ...]:
    """Cut ``n_layers`` layers into ``n_parts`` contiguous slices. By default the sizes differ by at most
    one (the earlier slices get the extra layers); ``counts`` (one whole number per slice, summing to
    ``n_layers``) sets each slice's size, unequal on purpose (``stage_layer_counts``). Each slice needs
    at least one whole layer."""
    n_layers = whole_number(n_layers, "n_layers (layers in the model)")
    n_parts = whole_number(n_parts, "n_parts (slices of the layer stack)")
    if n_parts > n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {n_parts} slices: each slice needs at least "
                         "one whole layer")
    counts = near_equal_parts(n_layers, n_parts) if counts is None else counts
    if isinstance(counts, (str, bytes)) or not isinstance(counts, Sequence):
        raise ValueError(f"layer counts must be a list of whole numbers, one per slice, got {counts!r}")
    if len(counts) != n_parts:
        raise ValueError(f"{len(counts)} layer counts {list(counts)} for {n_parts} slices: give one per slice")
    counts = [whole_number(c, f"layer count of slice {i} (layers in one slice)") for i, c in enumerate(counts)]
    if sum(counts) != n_layers:
        raise ValueError(f"the layer counts {counts} add up to {sum(counts)}, but the model has "
                         f"{n_layers} layers: every layer goes to exactly one slice")
    bounds, start = [], 0
    for c in counts:
        bounds.append(range(start, start + c))
        start += c
    return tuple(bounds)
