"""The pipeline's mechanism: one stage works through its list of actions, in exactly the schedule's order.

GPipe (Huang et al. 2019), 1F1B and interleaved 1F1B (Narayanan et al. 2021): rank ``r`` is stage ``r``
and holds its model chunks' layers. ``run_stage`` walks ``schedule.actions[r]``: take the action's input
(a microbatch of the batch, or a neighbour's result), run the op named by the action (``Stage.ops``), hand
the result on. Measurement attaches through ``probe`` (``runtime.measure.Probe``).
"""

from __future__ import annotations

import torch

from ..runtime.measure import NO_PROBE
from ..toy import block_reference


class Stage:
    """This rank's part of one pipeline step: its layers, its inputs, and what it keeps between ops.
    Every method takes the ``Action`` ``a`` it works on."""

    def __init__(self, schedule, rank, model, weights, chunks, microbatches, grad_outputs, links):
        self.schedule, self.rank, self.model, self.links = schedule, rank, model, links
        self.weights, self.chunks = weights, chunks  # layer index -> weights; chunks[c]: chunk c's indices
        self.microbatches, self.grad_outputs = microbatches, grad_outputs  # the batch, and dL/d(output), cut
        self.last = schedule.n_virtual_stages - 1
        self.stash = {}  # (microbatch, chunk) -> (input, output): in flight until its backward
        self.local = {}  # results handed to this rank's own next chunk
        self.outputs, self.grad_x = {}, {}  # the step's results, by microbatch
        self.ops = {"F": self.forward, "B": self.backward}  # an action runs the method its op names

    def forward(self, a, x):
        with torch.set_grad_enabled(self.schedule.training):
            h = x.detach().requires_grad_(self.schedule.training)
            out = h
            for i in self.chunks[a.chunk]:
                out = block_reference(out, self.weights[i], self.model)  # (rows, seq, d_model)
        if self.schedule.training:
            self.stash[a.microbatch, a.chunk] = (h, out)  # its activations stay until its backward
        if self.schedule.virtual_stage(a) == self.last:
            self.outputs[a.microbatch] = out.detach()
        return out

    def backward(self, a, grad):  # grad: dL/d(this chunk's output), (rows, seq, d_model)
        h, out = self.stash.pop((a.microbatch, a.chunk))
        torch.autograd.backward(out, grad)  # weight gradients accumulate, microbatch by microbatch
        if self.schedule.virtual_stage(a) == 0:
            self.grad_x[a.microbatch] = h.grad
        return h.grad  # dL/d(this chunk's input), for the chunk before

    def take(self, a, probe):
        """The action's input: a microbatch of the batch, the loss's gradient, or a neighbour's result."""
        producer = self.schedule.producer(a)
        if producer is None:  # the first chunk's forward
            return self.microbatches[a.microbatch]
        if a.op == "B" and self.schedule.virtual_stage(a) == self.last:  # the last chunk's backward
            return self.grad_outputs[a.microbatch]
        if producer.stage == self.rank:  # this rank's own previous chunk
            return self.local.pop(producer)
        with probe.span("wait", kind="wait", op=a.op, microbatch=a.microbatch, chunk=a.chunk, source=producer.stage):
            return self.links.take(producer)

    def give(self, a, result):
        dst = self.schedule.destination(a)
        if dst == self.rank:
            self.local[a] = result.detach()
        elif dst is not None:
            self.links.put(dst, result)


def run_stage(stage: Stage, probe=NO_PROBE) -> Stage:
    """Run this stage's actions in the schedule's order; return the stage, its results filled in."""
    for a in stage.schedule.actions[stage.rank]:
        x = stage.take(a, probe)
        with probe.span(a.label, kind="compute", op=a.op, microbatch=a.microbatch, chunk=a.chunk, stage=stage.rank):
            result = stage.ops[a.op](a, x)
        stage.give(a, result)
    stage.links.close()  # every message handed over before the step counts as done
    return stage
