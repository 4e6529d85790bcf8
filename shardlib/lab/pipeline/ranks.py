"""``pipeline_step_on_rank``: the stage loop (``core.pipeline.engine``) on a rank, with measurement attached.

The rank keeps only its chunks' layers, cuts the batch into microbatches, opens its links to the other
stages (``core.pipeline.messages``) and runs ``engine.run_stage`` with a probe that records every op and
every wait as a span on ``ctx.timeline``, pads each op to a set duration when asked (``forward_s`` /
``backward_s`` / ``weight_s``: the layers still compute for real), and meters what each forward keeps for
its backward (``lab.measure.SavedBytes``) and how many microbatches are in flight (until their W when
the backward is split). Output and gradients equal ``reference.unpipelined_step`` bit for bit.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.engine import Stage, run_stage
from shardlib.core.pipeline.messages import Links
from shardlib.core.pipeline.schedules import Schedule
from shardlib.core.pipeline.stages import layers_of_stage
from shardlib.core.toy import block_reference
from shardlib.lab.measure import SavedBytes
from shardlib.lab.pipeline.reference import check_pipeline_inputs, durations
from shardlib.predict.pipeline import microbatch_sizes


@dataclass(frozen=True)
class StageResult:
    """What one stage returns from a pipeline step (``ranks.run`` keeps them in stage order): its ``output``
    (the stage holding the last layers), ``grad_x`` (stage 0, training), ``grads`` (its layers' weight
    gradients, by global layer index, then by name), the peaks measured while it ran, and ``layers`` (the
    global layer indices of each chunk)."""

    layers: tuple[tuple[int, ...], ...]
    peak_in_flight: int
    peak_activation_bytes: int
    output: torch.Tensor | None
    grad_x: torch.Tensor | None
    grads: dict


def toy_chunk(weights: dict, layers: range, model: ModelConfig):
    """A model chunk for the engine: the toy's blocks ``layers`` (``toy.block_reference``, the same layer
    function the one-process reference calls), on ``weights`` (layer index -> that layer's weights)."""
    def chunk(h):  # (rows, seq, d_model) -> (rows, seq, d_model)
        for i in layers:
            h = block_reference(h, weights[i], model)
        return h
    return chunk


class _StageProbe:
    """Spans on the rank's timeline; each compute op padded with sleep to its target (``None``: real
    compute); the bytes each forward saves for its backward, and the peaks in flight. A microbatch is in
    flight until the op in ``release`` (``"W"`` when the backward is split: W still needs what F saved)."""

    def __init__(self, timeline, training: bool, param_ptrs: set[int], target_s: dict, release: str = "B") -> None:
        self.timeline, self.training, self.param_ptrs = timeline, training, param_ptrs
        self.target_s, self.release = target_s, release
        self.held_bytes: dict = {}  # (microbatch, chunk) -> bytes its forward saved: in flight
        self.peak_in_flight = self.peak_bytes = 0

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        if kind != "compute":
            with self.timeline.span(name, kind, **attrs):
                yield
            return
        op, key = attrs["op"], (attrs["microbatch"], attrs["chunk"])
        start = self.timeline.now_s()
        with SavedBytes(self.param_ptrs) if op == "F" else nullcontext() as saved:
            yield
        if op == "F" and self.training:  # its activations stay until its backward: in flight
            self.held_bytes[key] = saved.size_bytes
            self.peak_in_flight = max(self.peak_in_flight, len(self.held_bytes))
            self.peak_bytes = max(self.peak_bytes, sum(self.held_bytes.values()))
        elif op == self.release:
            self.held_bytes.pop(key)
        target_s = self.target_s.get(op)
        if target_s is not None and (left := start + target_s - self.timeline.now_s()) > 0:
            time.sleep(left)
        self.timeline.record(name, start, self.timeline.now_s(), kind, **attrs, padded_to_s=target_s)


def pipeline_step_on_rank(ctx, schedule: Schedule, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                          grad_output: torch.Tensor | None = None, forward_s=None, backward_s=None,
                          layer_counts=None, weight_s=None) -> StageResult:
    """One pipeline step on this rank: stage ``ctx.rank`` of ``schedule``.

    ``layers`` are the whole model's weights (``toy.stack_weights(model, ...)``: whole blocks, or
    MLP-only layers); this rank keeps only its slices. ``x`` is the whole batch (stage 0 cuts it into
    microbatches), ``grad_output`` the gradient of the loss with respect to the output (the last stage
    cuts it), for training schedules. ``forward_s`` / ``backward_s``: pad each of this stage's forwards /
    backwards to that many seconds (a number, or one per stage), or ``None`` for real compute only;
    ``weight_s`` pads each W (a schedule without W pads its whole backward to ``backward_s + weight_s``).
    ``layer_counts``: layers per stage when they are not to be cut evenly (``reference.layers_of_stage``).

    Returns this stage's part of the result, a ``StageResult``.
    """
    check_pipeline_inputs(schedule, layers, tuple(x.shape), None if grad_output is None else tuple(grad_output.shape),
                          ctx.world_size, layer_counts=layer_counts)
    p, v, me = schedule.n_stages, schedule.n_chunks, ctx.rank
    fwd_s = durations(forward_s, p, "forward_s")[me]
    bwd_s = durations(backward_s, p, "backward_s")[me]
    wgt_s = durations(weight_s, p, "weight_s")[me]
    if wgt_s is not None and bwd_s is not None and not schedule.split_backward:
        bwd_s += wgt_s  # B is the whole backward: input and weight gradients
    targets = {op: None if t is None else t / v  # a chunk holds 1/v of the stage's layers
               for op, t in (("F", fwd_s), ("B", bwd_s), ("W", wgt_s))}
    training = schedule.training

    held = layers_of_stage(schedule, len(layers), me, layer_counts)  # one range of layer indices per chunk
    weights = {i: {k: t.detach().clone().to(ctx.device).requires_grad_(training) for k, t in layers[i].items()}
               for chunk in held for i in chunk}
    param_ptrs = {w.data_ptr() for ws in weights.values() for w in ws.values()}
    sizes = microbatch_sizes(x.shape[0], schedule.n_microbatches)
    rest = tuple(x.shape[1:])
    x_mbs = torch.split(x.to(ctx.device), list(sizes))
    g_mbs = None if grad_output is None else torch.split(grad_output.to(ctx.device), list(sizes))
    links = Links(ctx.comm, schedule, me, lambda a: (sizes[a.microbatch],) + rest, ctx.device)

    probe = _StageProbe(ctx.timeline, training, param_ptrs, targets, "W" if schedule.split_backward else "B")
    chunks = [toy_chunk(weights, layers_of_chunk, model) for layers_of_chunk in held]
    stage = run_stage(Stage(schedule, me, chunks, x_mbs, links, g_mbs), probe)

    m = schedule.n_microbatches
    return StageResult(tuple(tuple(r) for r in held), probe.peak_in_flight, probe.peak_bytes,
                       torch.cat([stage.outputs[i] for i in range(m)]) if stage.outputs else None,
                       torch.cat([stage.grad_x[i] for i in range(m)]) if stage.grad_x else None,
                       {i: {k: t.grad for k, t in w.items()} for i, w in weights.items()} if training else {})
