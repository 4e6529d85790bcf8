"""Activations measured on one process: the bytes each layer keeps for its backward, with and without
recomputation (Chen et al. 2016; torch ships it as ``torch.utils.checkpoint``).

``measure_activations`` counts, per unit (``flat.parameter_units``), the bytes autograd saves while
the unit's forward runs (``lab.measure.SavedBytes``), and how many unit forwards one step ran.
``Recompute`` is the reentrant ``torch.utils.checkpoint`` written out (torch's own loads its compiler,
seconds of imports, the first time it runs). Set beside ``predict.mlp_activation_bytes``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from shardlib.core.checks import flag
from shardlib.core.data_parallel.flat import parameter_units
from shardlib.lab.data_parallel.reference import global_mse
from shardlib.lab.measure import SavedBytes


class Recompute(torch.autograd.Function):
    """The forward runs ``inner`` without autograd and saves only its input; the backward runs ``inner``
    again, with autograd, and backpropagates through that copy."""

    @staticmethod
    def forward(ctx, inner: nn.Module, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.inner = inner
        ctx.save_for_backward(x)  # the one activation kept: the unit's input
        with torch.no_grad():
            return inner(x)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            h = x.detach().requires_grad_(x.requires_grad)
            out = ctx.inner(h)  # the second forward: the activations exist again, briefly
            seeded = (out * grad_out).sum()  # its gradient at ``out`` is grad_out itself, bit for bit
        params = tuple(ctx.inner.parameters())
        wanted = ((h,) if h.requires_grad else ()) + params
        grads = torch.autograd.grad(seeded, wanted)
        grad_x = grads[0] if h.requires_grad else None
        return (None, grad_x) + tuple(grads[len(wanted) - len(params):])


class Checkpointed(nn.Module):
    """``inner`` run under ``Recompute``: only its input is kept for the backward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Recompute.apply(self.inner, x, *self.inner.parameters())


@dataclass(frozen=True)
class ActivationMeasurement:
    """One training step's activations on one process: what each unit keeps for its backward, and the
    unit forwards the step ran (two per unit with checkpointing)."""

    checkpointed: bool
    unit_names: tuple[str, ...]
    saved_bytes_per_unit: tuple[int, ...]
    unit_forwards: int

    total_bytes = property(lambda self: sum(self.saved_bytes_per_unit))  # all units together


def measure_activations(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        checkpoint: bool = False) -> ActivationMeasurement:
    """One training step of a copy of ``model`` on ``(x, y)`` (mean squared error), every unit
    checkpointed or none."""
    checkpoint = flag(checkpoint, "checkpoint")
    model = copy.deepcopy(model)
    names = [name for name, _ in parameter_units(model) if name]
    if not names:
        raise ValueError("the model has no children with parameters to measure")
    for name in names if checkpoint else ():
        setattr(model, name, Checkpointed(getattr(model, name)))
    param_ptrs = {p.data_ptr() for p in model.parameters()}
    counters = [SavedBytes(param_ptrs) for _ in names]  # per unit: what it saves while its forward runs
    forwards = [0]

    def count_from(u: int) -> None:  # a forward pre-hook returns None, or its value replaces the input
        counters[u].__enter__()

    for u, name in enumerate(names):
        unit = getattr(model, name)
        unit.register_forward_pre_hook(lambda m, args, u=u: count_from(u))
        unit.register_forward_hook(lambda m, args, out, u=u: counters[u].__exit__(None, None, None))
        inner = unit.inner if checkpoint else unit
        inner.register_forward_pre_hook(lambda m, args: forwards.__setitem__(0, forwards[0] + 1))

    global_mse(model(x), y, y.numel()).backward()  # one step: the forward's bytes, the backward's recomputation
    return ActivationMeasurement(checkpoint, tuple(names), tuple(c.size_bytes for c in counters), forwards[0])
