"""One pipeline step on the ranks, read as a ``PipelineRun`` and checked against the one-process reference.

* ``pipeline_step_on_rank``: the stage loop (``core.pipeline.engine``) on a rank, on its chunks' layers, its
  links to the other stages open (``core.pipeline.messages``), with ``lab.measure.ActivationProbe``: every
  op and wait a span, each op padded to a set duration when asked, the activation bytes in flight metered.
* ``run_pipeline``: the inputs checked (``check_pipeline_inputs``: a ``ValueError`` with the numbers, never a
  hang), then the step ``repeats`` times through ``lab.harness.on_ranks``.
* ``unpipelined_step``: the reference, ``core.model.stack_reference`` microbatch by microbatch in one process.
* ``run_pipeline_vs_tp_bytes``: one step's bytes (forward only, or training) pipelined, against the same
  layers tensor-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from shardlib.core.checks import TOLERANCE, same_dtype
from shardlib.core.config import ModelConfig
from shardlib.core.model import block_reference, stack_reference
from shardlib.core.pipeline.engine import Stage, run_stage
from shardlib.core.pipeline.messages import Links
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.schedules import Schedule, per_stage
from shardlib.core.pipeline.stages import layers_of_stage, split_layers
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.measure import ActivationProbe
from shardlib.lab.tensor_parallel.drivers import tp_block_on_rank
from shardlib.predict.pipeline import measure_bubble, measured_in_flight, microbatch_sizes


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


@dataclass(frozen=True)
class Exactness:
    """A pipeline step against the one-process reference: ``bit_for_bit`` on the same microbatches
    (output, input gradient, every weight gradient), and the largest gap from one pass over the whole
    batch (``whole_batch_gap``, within ``TOLERANCE`` when ``whole_batch_close``)."""

    bit_for_bit: bool
    whole_batch_gap: float
    whole_batch_close: bool


@dataclass(frozen=True)
class PipelineRun:
    """One step of ``schedule`` run on the ranks (``got``: what ``on_ranks`` gathered from
    ``pipeline_step_on_rank``, every repeat), read at repeat ``repeat``. Every repeat computes the same
    tensors; the spans, the comm log and the bubble are the chosen repeat's."""

    schedule: Schedule
    got: Measured = field(repr=False)
    inputs: tuple = field(default=(), repr=False)  # (model, layers, x, grad_output): for against_reference
    forward_s: object = None
    backward_s: object = None
    weight_s: object = None
    repeat: int = -1

    output = property(lambda self: gathered_output(self.got))  # (batch, seq, d_model), from the last stage
    grad_x = property(lambda self: self.got.first("grad_x"))  # (batch, seq, d_model), from stage 0
    grads = property(lambda self: gathered_grads(self.got))  # every layer's weight gradients, in layer order
    spans = property(lambda self: self.got.spans(repeat=self.repeat))
    bubble = property(lambda self: measure_bubble(self.spans, self.schedule.n_stages))
    repeats = property(lambda self: len(self.got.times_s[0]))
    bubbles = property(lambda self: tuple(self.at(i).bubble for i in range(self.repeats)))  # in the order run

    @property
    def layers_held(self) -> list[list[int]]:
        """Per rank, the global layer indices it held (every chunk's together)."""
        return [[i for chunk in held for i in chunk] for held in self.got.each("layers")]

    def at(self, repeat: int) -> "PipelineRun":
        return replace(self, repeat=repeat)

    def fastest(self) -> "PipelineRun":
        """The repeat with the shortest step: with every op padded, other work only ever adds time."""
        windows = [b.window_s for b in self.bubbles]
        return self.at(windows.index(min(windows)))

    @property
    def peak_in_flight(self) -> tuple[int, ...]:
        """Per stage, the most microbatches held at once (from the forward to the B, or to the W when the
        backward is split), read from the timeline."""
        return measured_in_flight(self.spans, self.schedule.n_stages)

    @property
    def peak_activation_bytes(self) -> tuple[int, ...]:  # per stage, the most its forwards in flight had saved
        return tuple(max((s.attrs.get("held_bytes", 0) for s in self.spans if s.rank == r), default=0)
                     for r in range(self.schedule.n_stages))

    def sent_bytes(self) -> int:  # between stages this step: the comm log's sends, every rank
        return self.got.bytes("send", repeat=self.repeat)

    def sent_messages(self) -> int:
        return self.got.count("send", repeat=self.repeat)

    def against_reference(self) -> Exactness:
        """This step against ``unpipelined_step`` on the same inputs (see ``Exactness``)."""
        model, layers, x, grad = self.inputs
        same = unpipelined_step(model, layers, x, self.schedule.n_microbatches, grad)
        whole = unpipelined_step(model, layers, x, 1, grad)

        def pairs(ref: dict) -> list:
            return [(self.output, ref["output"])] + [(mine[k], theirs[k]) for mine, theirs in
                                                     zip(self.grads, ref.get("grads", ())) for k in theirs]

        training = grad is not None
        exact = len(self.grads) == (len(layers) if training else 0) and compared(
            pairs(same) + ([(self.grad_x, same["grad_x"])] if training else []))[0]
        return Exactness(exact, *compared(pairs(whole))[1:])


def compared(pairs) -> tuple[bool, float, bool]:
    """Over ``(a, b)`` tensor pairs: all equal bit for bit, the largest gap, all within ``TOLERANCE``."""
    return (all(torch.equal(a, b) for a, b in pairs), max(float((a - b).abs().max()) for a, b in pairs),
            all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs))


def gathered_output(got: Measured) -> torch.Tensor:
    """The one output the ranks returned (the rank holding the last layers): (batch, seq, d_model)."""
    return next(o for o in got.each("output") if o is not None)


def gathered_grads(got: Measured) -> list[dict]:
    """Every layer's weight gradients, gathered from the ranks' ``grads`` (by layer index), in layer order."""
    merged = {i: g for per_rank in got.each("grads") for i, g in per_rank.items()}
    return [merged[i] for i in sorted(merged)]


def run_pipeline(ranks, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                 grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None,
                 layer_counts=None, weight_s=None, repeats: int = 1) -> PipelineRun:
    """Check the inputs here (a clear ValueError before any rank starts), then run one step of
    ``schedule`` on ``ranks``, ``repeats`` times (``pipeline_step_on_rank`` says what each input means)."""
    check_pipeline_inputs(schedule, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ranks.world_size, x.dtype, layer_counts)
    for value, name in ((forward_s, "forward_s"), (backward_s, "backward_s"), (weight_s, "weight_s")):
        per_stage(value, schedule.n_stages, name)
    got = on_ranks(ranks, pipeline_step_on_rank, schedule, model, layers, x, grad_output, forward_s, backward_s,
                   layer_counts=layer_counts, weight_s=weight_s, repeats=repeats)
    return PipelineRun(schedule, got, (model, layers, x, grad_output), forward_s, backward_s, weight_s)


@dataclass(frozen=True)
class PipelineVsTPBytes:
    """One step (forward only, or training) of the same layers on the same ranks, pipelined and
    tensor-parallel, from the comm logs: the pipeline's sends (all ranks together), and one rank's
    all-reduces under tensor parallelism (each layer's MLP split across the ranks, as in ``tensor_parallel``)."""

    activation_bytes: int  # the whole batch's activations: batch x seq x d_model x 4
    pipeline_messages: int
    pipeline_bytes: int
    tp_collectives_per_rank: int
    tp_bytes_per_rank: int

    @property
    def ratio(self) -> float:
        """Tensor parallelism's bytes per rank over the whole pipeline's bytes."""
        return self.tp_bytes_per_rank / self.pipeline_bytes


def run_pipeline_vs_tp_bytes(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             grad_output: torch.Tensor | None = None, n_microbatches: int = 4) -> PipelineVsTPBytes:
    """Count the bytes of one step (``n_microbatches``) of MLP-only ``layers`` both ways: a training step
    (1F1B) with ``grad_output``, a forward-only pass (a server's) without it."""
    if any("q" in w for w in layers):
        raise ValueError("the comparison splits each layer's MLP: give MLP-only layers (parts=('mlp',))")
    schedule = make_schedule("1f1b", ranks.world_size, n_microbatches, grad_output is not None)
    pp = run_pipeline(ranks, schedule, model, layers, x, grad_output)
    tp = [on_ranks(ranks, tp_block_on_rank, "mlp", x, w, None, grad_output) for w in layers]  # one layer at a time
    return PipelineVsTPBytes(x.numel() * x.element_size(), pp.sent_messages(), pp.sent_bytes(),
                             sum(t.count(rank=0) for t in tp), sum(t.bytes(rank=0) for t in tp))
