"""``pipeline_step_on_rank``: the stage loop (``core.pipeline.engine``) on a rank, with a probe attached, and
``check_pipeline_inputs``, run on every rank and in the driver before anything starts, so a mistake is a
``ValueError`` with the numbers, never a hang.

The rank keeps only its chunks' layers, cuts the batch into microbatches, opens its links to the other
stages (``core.pipeline.messages``) and runs ``engine.run_stage`` with
``lab.measure.ActivationProbe``: every op and every wait a span on ``ctx.timeline``, each op padded to a
set duration when asked (the layers still compute for real), and the activation bytes in flight metered.
Output and gradients equal ``drivers.unpipelined_step`` bit for bit.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import same_dtype
from shardlib.core.config import ModelConfig
from shardlib.core.model import block_reference
from shardlib.core.pipeline.engine import Stage, run_stage
from shardlib.core.pipeline.messages import Links
from shardlib.core.pipeline.schedules import Schedule, per_stage
from shardlib.core.pipeline.stages import layers_of_stage, split_layers
from shardlib.lab.measure import ActivationProbe
from shardlib.predict.pipeline import microbatch_sizes


def toy_chunk(weights: dict, layers: range, model: ModelConfig):
    """A model chunk for the engine: the toy's blocks ``layers`` (``model.block_reference``, the same layer
    function the one-process reference calls), on ``weights`` (layer index -> that layer's weights)."""
    def chunk(h):  # (rows, seq, d_model) -> (rows, seq, d_model)
        for i in layers:
            h = block_reference(h, weights[i], model)
        return h
    return chunk


def pipeline_step_on_rank(ctx, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None,
                          layer_counts=None, weight_s=None) -> dict:
    """One pipeline step on this rank: stage ``ctx.rank`` of ``schedule``.

    ``layers`` are the whole model's weights (``toy.stack_weights``: whole blocks, or MLP-only layers);
    this rank keeps only its slices. ``x`` is the whole batch, ``grad_output`` the gradient of the loss
    with respect to the output, for training schedules. ``forward_s`` / ``backward_s`` / ``weight_s`` pad
    each F / B / W of this stage to that many seconds (a number, or one per stage; ``None``: real compute);
    a schedule without W pads its whole backward to ``backward_s + weight_s``. ``layer_counts``: layers
    per stage when they are not cut evenly (``stages.layers_of_stage``).

    Returns ``layers`` (the global layer indices of each chunk), ``output`` (the stage holding the last
    layers, else ``None``), ``grad_x`` (stage 0, training) and ``grads`` (by layer index, then name).
    """
    check_pipeline_inputs(schedule, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ctx.world_size, layer_counts=layer_counts)
    p, me, training = schedule.n_stages, ctx.rank, schedule.training
    fwd_s, bwd_s, wgt_s = (per_stage(v, p, n)[me] for v, n in
                           ((forward_s, "forward_s"), (backward_s, "backward_s"), (weight_s, "weight_s")))
    if wgt_s is not None and bwd_s is not None and not schedule.split_backward:
        bwd_s += wgt_s  # B is the whole backward: input and weight gradients
    targets = {op: None if t is None else t / schedule.n_chunks  # a chunk holds 1/v of the stage's layers
               for op, t in (("F", fwd_s), ("B", bwd_s), ("W", wgt_s))}

    held = layers_of_stage(schedule, len(layers), me, layer_counts)  # one range of layer indices per chunk
    weights = {i: {k: t.detach().clone().to(ctx.device).requires_grad_(training) for k, t in layers[i].items()}
               for chunk in held for i in chunk}
    param_ptrs = {w.data_ptr() for ws in weights.values() for w in ws.values()}
    sizes = list(microbatch_sizes(x.shape[0], schedule.n_microbatches))
    x_mbs = torch.split(x.to(ctx.device), sizes)  # each (rows, seq, d_model)
    g_mbs = None if grad_output is None else torch.split(grad_output.to(ctx.device), sizes)
    links = Links(ctx.comm, schedule, me, lambda a: (sizes[a.microbatch],) + tuple(x.shape[1:]), ctx.device, x.dtype)
    chunks = [toy_chunk(weights, layers_of_chunk, model) for layers_of_chunk in held]
    release = ("W" if schedule.split_backward else "B") if training else None  # what frees F's activations
    stage = run_stage(Stage(schedule, me, chunks, x_mbs, links, g_mbs),
                      ActivationProbe(ctx.timeline, release, param_ptrs, targets))

    def joined(parts: dict):  # microbatch -> (rows, seq, d_model), joined into the batch
        return torch.cat([parts[i] for i in range(len(sizes))]) if parts else None

    return {"layers": tuple(tuple(r) for r in held), "output": joined(stage.outputs), "grad_x": joined(stage.grad_x),
            "grads": {i: {k: t.grad for k, t in w.items()} for i, w in weights.items()} if training else {}}


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
