"""The pipeline's mechanism: one stage works through its list of actions, in exactly the schedule's order.

Rank ``r`` is stage ``r`` and holds its model chunks' layers. ``run_stage`` walks ``schedule.actions[r]``:
take the action's input (a microbatch of the batch, or a neighbour's result), run the op named by the
action (``Stage.ops``), hand the result on. With the backward split (zero-bubble schedules, Qi et al.
2024), B computes only the input gradient and the gradient at every linear layer's output; W, later,
turns those into the weight gradients, linear by linear. Measurement attaches through ``probe``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..runtime.measure import NO_PROBE
from ..toy import block_reference


class _Linears(TorchFunctionMode):
    """While a chunk's forward runs, note each linear layer's output and weight: where B and W part."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is F.linear:
            self.found.append((out, args[1]))  # (output, weight)
        return out


class Stage:
    """This rank's part of one pipeline step: its layers, its inputs, and what it keeps between ops.
    Every method takes the ``Action`` ``a`` it works on."""

    def __init__(self, schedule, rank, model, weights, chunks, microbatches, grad_outputs, links):
        self.schedule, self.rank, self.model, self.links = schedule, rank, model, links
        self.weights, self.chunks = weights, chunks  # layer index -> weights; chunks[c]: chunk c's indices
        self.microbatches, self.grad_outputs = microbatches, grad_outputs  # the batch, and dL/d(output), cut
        self.last = schedule.n_virtual_stages - 1
        self.stash = {}  # (microbatch, chunk) -> (input, output, linears): in flight until its backward
        self.pending = {}  # (microbatch, chunk) -> [(linear output, weight, its gradient)]: B done, W to come
        self.local = {}  # results handed to this rank's own next chunk
        self.outputs, self.grad_x = {}, {}  # the step's results, by microbatch
        self.split = schedule.split_backward
        # an action runs the method its op names; B is the whole backward unless the schedule has W actions
        self.ops = {"F": self.forward, "B": self.backward_input if self.split else self.backward,
                    "W": self.backward_weight}

    def forward(self, a, x):
        linears = _Linears()
        with torch.set_grad_enabled(self.schedule.training), linears if self.split else nullcontext():
            h = x.detach().requires_grad_(self.schedule.training)
            out = h
            for i in self.chunks[a.chunk]:
                out = block_reference(out, self.weights[i], self.model)  # (rows, seq, d_model)
        if self.schedule.training:
            self.stash[a.microbatch, a.chunk] = (h, out, linears.found)  # kept until its backward
        if self.schedule.virtual_stage(a) == self.last:
            self.outputs[a.microbatch] = out.detach()
        return out

    def backward(self, a, grad):  # grad: dL/d(this chunk's output), (rows, seq, d_model)
        h, out, _ = self.stash.pop((a.microbatch, a.chunk))
        torch.autograd.backward(out, grad)  # weight gradients accumulate, microbatch by microbatch
        if self.schedule.virtual_stage(a) == 0:
            self.grad_x[a.microbatch] = h.grad
        return h.grad  # dL/d(this chunk's input), for the chunk before

    def backward_input(self, a, grad):
        """B of a split backward: the input gradient, and the gradient at each linear's output (kept for W)."""
        h, out, linears = self.stash.pop((a.microbatch, a.chunk))
        grad_h, *grad_ys = torch.autograd.grad(out, [h] + [y for y, _ in linears], grad, retain_graph=True)
        self.pending[a.microbatch, a.chunk] = [(y, w, g) for (y, w), g in zip(linears, grad_ys)]
        if self.schedule.virtual_stage(a) == 0:
            self.grad_x[a.microbatch] = grad_h
        return grad_h

    def backward_weight(self, a, _):
        """W: each linear's weight gradient from its output's gradient; accumulated in the order W's run."""
        for y, w, grad_y in self.pending.pop((a.microbatch, a.chunk)):
            (grad_w,) = torch.autograd.grad(y, [w], grad_y)  # only this linear's weight path
            w.grad = grad_w if w.grad is None else w.grad + grad_w

    def take(self, a, probe):
        """The action's input: a microbatch of the batch, the loss's gradient, or a neighbour's result."""
        producer = self.schedule.producer(a)
        if producer is None:  # the first chunk's forward
            return self.microbatches[a.microbatch]
        if a.op == "W":  # its input is what its own B left in ``pending``
            return None
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
        stage.give(a, result)  # a W hands nothing on
    stage.links.close()  # every message handed over before the step counts as done
    return stage
