"""The pipeline's reference: the whole stack in one process, microbatch by microbatch, and the input checks.

``unpipelined_step`` on the same microbatches is what a real pipeline step must equal bit for bit
(pipelining adds no cross-rank sum); against one pass over the whole batch, compare within
``core.checks.TOLERANCE``. ``check_pipeline_inputs`` runs on every rank and in the driver before
anything starts, so a mistake is a ``ValueError`` with the numbers, never a hang. No ``torch.distributed``.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import number_at_least, one_per, same_dtype
from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference
from shardlib.core.pipeline.schedules import Schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.predict.pipeline import microbatch_sizes


def unpipelined_step(model: ModelConfig, layers: list[dict], x: torch.Tensor, n_microbatches: int = 1,
                     grad_output: torch.Tensor | None = None) -> dict:
    """The whole stack (``model.stack_reference``) in one process, microbatch by microbatch
    (``n_microbatches = 1`` is one pass over the whole batch). Returns the output, and with
    ``grad_output`` (the gradient of the loss with respect to the output) the input gradient and every
    layer's weight gradients, accumulated over the microbatches in order."""
    training = grad_output is not None
    weights = [{k: t.detach().clone().requires_grad_(training) for k, t in w.items()} for w in layers]
    sizes = list(microbatch_sizes(x.shape[0], n_microbatches))
    outputs, grad_xs = [], []
    with torch.set_grad_enabled(training):
        for i, x_mb in enumerate(torch.split(x, sizes)):
            h = x_mb.clone().requires_grad_(training)
            out = stack_reference(h, weights, model)  # (rows, seq, d_model)
            if training:
                out.backward(torch.split(grad_output, sizes)[i])
                grad_xs.append(h.grad)
            outputs.append(out.detach())
    result = {"output": torch.cat(outputs)}
    if training:
        result["grad_x"] = torch.cat(grad_xs)
        result["grads"] = [{k: t.grad for k, t in w.items()} for w in weights]
    return result


def durations(value, n_stages: int, name: str) -> list:
    """Per stage, the seconds each op is padded to (``None``: real compute only)."""
    if value is None:
        return [None] * n_stages
    values = one_per(value if isinstance(value, (list, tuple)) else [value] * n_stages, n_stages, name, "stage")
    return [number_at_least(v, f"{name} (None for real compute, or seconds per op)") for v in values]


def check_pipeline_inputs(schedule: Schedule, layers: list[dict], x_shape, grad_output_shape=None,
                          world_size: int | None = None, x_dtype: torch.dtype | None = None,
                          layer_counts=None) -> None:
    """Raise a ValueError saying why this run cannot go ahead, if it cannot, before any rank starts on
    it (``layer_counts``: as ``layers_of_stage`` takes them)."""
    if not isinstance(schedule, Schedule):
        raise ValueError(f"expected a Schedule from make_schedule(...), got {type(schedule).__name__}")
    n_layers = len(layers)
    weights = [t for t in (layers[0].values() if layers else ()) if isinstance(t, torch.Tensor)]
    if x_dtype is not None and weights:
        same_dtype(x_dtype, weights[0].dtype, "the input's dtype")
    if world_size is not None and world_size != schedule.n_stages:
        raise ValueError(f"this schedule has {schedule.n_stages} stages but there are {world_size} ranks: "
                         "a pipeline runs one stage per rank, so use a schedule with "
                         f"n_stages = {world_size} (or a Ranks({schedule.n_stages}) pool)")
    if n_layers < schedule.n_virtual_stages:
        chunks = f" x {schedule.n_chunks} model chunks" if schedule.n_chunks > 1 else ""
        raise ValueError(f"a pipeline of {schedule.n_stages} stages{chunks} needs at least "
                         f"{schedule.n_virtual_stages} layers, one whole layer per slice; the model has {n_layers}")
    if layer_counts is not None:
        split_layers(n_layers, schedule.n_virtual_stages, layer_counts)  # one count per slice, adding up
    if len(x_shape) != 3:
        raise ValueError(f"the input must be (batch, seq, d_model), got shape {tuple(x_shape)}")
    d_model = int(layers[0]["o" if "o" in layers[0] else "down"].shape[0])
    if x_shape[-1] != d_model:
        raise ValueError(f"the input has {x_shape[-1]} features per token but the layers expect d_model = {d_model}")
    microbatch_sizes(x_shape[0], schedule.n_microbatches)  # more microbatches than rows
    if schedule.training and grad_output_shape is None:
        raise ValueError("a training schedule needs grad_output, the gradient of the loss with respect to "
                         "the output, to start its backwards")
    if not schedule.training and grad_output_shape is not None:
        raise ValueError("a forward-only schedule runs no backwards: leave grad_output out, or build the "
                         "schedule with training=True")
    if grad_output_shape is not None and tuple(grad_output_shape) != tuple(x_shape):
        raise ValueError(f"grad_output has shape {tuple(grad_output_shape)} but the output will be "
                         f"{tuple(x_shape)} (the layers keep the input's shape)")
