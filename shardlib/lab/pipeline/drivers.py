"""Pipeline steps run on a pool: gathered, measured, and checked against the one-process reference.

* ``unpipelined_step``: the reference, ``core.model.stack_reference`` microbatch by microbatch in one process.
* ``run_pipeline``: one step of a ``Schedule`` on the ranks (one stage per rank), ``repeats`` times,
  through ``lab.harness.on_ranks``, read as a ``PipelineRun``: output, gradients, spans, comm log, the
  bubble and the activations in flight measured, and ``against_reference()`` for the exactness check.
* ``run_pipeline_vs_tp_bytes``: the bytes of one training step pipelined, against the same layers
  tensor-parallel, both read from the comm log.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from shardlib.core.checks import TOLERANCE
from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference
from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.schedules import Schedule, per_stage
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.pipeline.ranks import check_pipeline_inputs, pipeline_step_on_rank
from shardlib.lab.tensor_parallel.ranks import tp_block_on_rank
from shardlib.predict.pipeline import measure_bubble, measured_in_flight, microbatch_sizes


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
    per_repeat = property(lambda self: tuple(self.at(i) for i in range(self.repeats)))  # in the order run
    bubbles = property(lambda self: tuple(r.bubble for r in self.per_repeat))

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
    """One training step of the same layers on the same ranks, pipelined and tensor-parallel, from the
    comm logs: the pipeline's sends (all ranks together), and one rank's all-reduces under tensor
    parallelism (each layer's MLP split across the ranks, as in ``tensor_parallel``)."""

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
                             grad_output: torch.Tensor, n_microbatches: int = 4) -> PipelineVsTPBytes:
    """Count the bytes of one training step (1F1B, ``n_microbatches``) of MLP-only ``layers`` both ways."""
    if any("q" in w for w in layers):
        raise ValueError("the comparison splits each layer's MLP: give MLP-only layers (parts=('mlp',))")
    pp = run_pipeline(ranks, make_schedule("1f1b", ranks.world_size, n_microbatches), model, layers, x, grad_output)
    tp = [on_ranks(ranks, tp_block_on_rank, "mlp", x, w, None, grad_output) for w in layers]  # one layer at a time
    return PipelineVsTPBytes(x.numel() * x.element_size(), pp.sent_messages(), pp.sent_bytes(),
                             sum(t.count(rank=0) for t in tp), sum(t.bytes(rank=0) for t in tp))
