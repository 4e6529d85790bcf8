"""The pipeline's mechanism: one stage works through its list of actions, in exactly the schedule's order.

Rank ``r`` is stage ``r`` and holds its model chunks: per chunk, any callable (an ``nn.Module``) that maps
the chunk's input to its output; the chunk that ends the model also takes the microbatch's targets, when
the step has them (its output is then the per-token loss). ``run_stage`` walks ``schedule.actions[r]``:
take the action's input (a microbatch of the batch, or a neighbour's result), run the op named by the
action (``Stage.ops``), hand the result on. With the backward split (zero-bubble schedules, Qi et al.
2024), B computes only the input gradient and the gradient at every weighted op's output (``F.linear``,
``F.embedding``); W, later, turns those into the weight gradients, op by op, through autograd (so the
hooks a weight carries fire as in a whole backward). Measurement attaches through ``probe``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from shardlib.core.probe import NO_PROBE

WEIGHTED = (F.linear, F.embedding)  # the ops whose weight is their second argument: where B and W part


class _Linears(TorchFunctionMode):
    """While a chunk's forward runs, note each weighted op's output and weight (``WEIGHTED``)."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[torch.Tensor, torch.Tensor]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in WEIGHTED and len(args) > 1 and args[1].requires_grad:
            self.found.append((out, args[1]))  # (output, weight)
        return out


class Stage:
    """This rank's part of one pipeline step: its chunks, its inputs, and what it keeps between ops.
    Every method takes the ``Action`` ``a`` it works on."""

    def __init__(self, schedule, rank, chunks, microbatches, links, grad_outputs=None, targets=None):
        self.schedule, self.rank, self.chunks, self.links = schedule, rank, chunks, links  # chunks[c]: callable
        self.microbatches, self.grad_outputs = microbatches, grad_outputs  # the batch, and dL/d(output), cut
        self.targets = targets  # per microbatch, for the chunk that ends the model (None: it takes none)
        self.last = schedule.n_virtual_stages - 1
        self.stash = {}  # (microbatch, chunk) -> (input, output, weighted ops): in flight until its backward
        self.pending = {}  # (microbatch, chunk) -> [(op output, weight, its gradient)]: B done, W to come
        self.local = {}  # results handed to this rank's own next chunk
        self.outputs, self.grad_x = {}, {}  # the step's results, by microbatch
        self.split = schedule.split_backward
        # an action runs the method its op names; B is the whole backward unless the schedule has W actions
        self.ops = {"F": self.forward, "B": self.backward, "W": self.backward_weight}

    def forward(self, a, x):
        linears, ends = _Linears(), self.schedule.virtual_stage(a) == self.last
        with torch.set_grad_enabled(self.schedule.training), linears if self.split else nullcontext():
            h = x.detach().requires_grad_(self.schedule.training and x.is_floating_point())  # token ids: no grad
            chunk = self.chunks[a.chunk]
            out = chunk(h, self.targets[a.microbatch]) if ends and self.targets is not None else chunk(h)
        if self.schedule.training:
            self.stash[a.microbatch, a.chunk] = (h, out, linears.found)  # kept until its backward
        if ends:
            self.outputs[a.microbatch] = out.detach()
        return out

    def backward(self, a, grad):
        """B: from ``grad``, dL/d(this chunk's output), the input gradient for the chunk before. Whole, the
        weight gradients accumulate too, microbatch by microbatch; split, it keeps the gradient at each
        weighted op's output for W."""
        h, out, linears = self.stash.pop((a.microbatch, a.chunk))
        if not self.split:
            torch.autograd.backward(out, grad)
            grad_h = h.grad
        else:
            inputs = [h] * h.requires_grad + [y for y, _ in linears]
            grads = torch.autograd.grad(out, inputs, grad, retain_graph=True)
            grad_h, grad_ys = (grads[0], grads[1:]) if h.requires_grad else (None, grads)
            self.pending[a.microbatch, a.chunk] = [(y, w, g) for (y, w), g in zip(linears, grad_ys)]
        if self.schedule.virtual_stage(a) == 0 and grad_h is not None:
            self.grad_x[a.microbatch] = grad_h
        return grad_h

    def backward_weight(self, a, _):
        """W: each weighted op's weight gradient from its output's gradient, accumulated into ``w.grad`` by
        autograd (only that op's weight path), in the order the W's run."""
        for y, w, grad_y in self.pending.pop((a.microbatch, a.chunk)):
            torch.autograd.backward(y, grad_y, inputs=[w])

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
