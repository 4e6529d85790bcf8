"""Activations measured on one process: the bytes each layer keeps for its backward, with and without
recomputation (Chen et al. 2016; ``torch.utils.checkpoint``).

``measure_activations`` counts, per unit (``reference.parameter_units``), the bytes autograd saves
through a ``saved_tensors_hooks`` pair (tensors in a parameter's storage are weights, left out; a tensor
saved twice counts once), and how many unit forwards one step ran. A checkpointed unit saves nothing
through the hooks and keeps its input instead: that input is counted for it. The formula it is set
beside is ``predict.mlp_activation_bytes``. Torch, one process, no ranks.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as run_checkpointed

from ..checks import flag, whole_number
from .reference import global_mse, parameter_units


class Checkpointed(nn.Module):
    """``inner`` run under ``torch.utils.checkpoint``: only its input is kept for the backward."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_checkpointed(self.inner, x, use_reentrant=False)


@dataclass(frozen=True)
class ActivationMeasurement:
    """One training step's activations on one process: ``saved_bytes_per_unit`` (what each unit keeps
    for its backward), ``unit_forwards`` (unit forwards the step ran: one per unit, two with
    checkpointing), ``step_s`` (median forward + backward time), ``total_bytes`` (their sum)."""

    checkpointed: bool
    rows: int
    unit_names: tuple[str, ...]
    saved_bytes_per_unit: tuple[int, ...]
    unit_forwards: int
    step_s: float
    total_bytes: int  # all units together


class _Counter:
    """Attributes the bytes autograd saves to the unit whose forward is running."""

    def __init__(self, param_storages: set[int], n_units: int) -> None:
        self.param_storages = param_storages
        self.bytes = [0] * n_units
        self.current: int | None = None
        self.forwards = 0
        self._seen: set[tuple[int, int]] = set()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage().data_ptr()
        ident = (t.data_ptr(), t.numel())
        if self.current is not None and storage not in self.param_storages and ident not in self._seen:
            self._seen.add(ident)
            self.bytes[self.current] += t.numel() * t.element_size()
        return t

    def enter(self, u: int, checkpointed: bool, args) -> None:
        self.current = u
        if checkpointed and torch.is_grad_enabled():  # the checkpoint keeps its input alive for the rerun
            self.pack(args[0])

    def leave(self) -> None:
        self.current = None


def measure_activations(model: nn.Module, x: torch.Tensor, y: torch.Tensor, checkpoint: bool = False,
                        repeats: int = 5) -> ActivationMeasurement:
    """One training step of a copy of ``model`` on ``(x, y)`` (mean squared error), every unit
    checkpointed or none: what each unit saves, how many unit forwards ran, and the median step time
    over ``repeats`` steps (after one warm-up)."""
    checkpoint, repeats = flag(checkpoint, "checkpoint"), whole_number(repeats, "repeats")
    model = copy.deepcopy(model)
    names = [name for name, _ in parameter_units(model) if name]
    if not names:
        raise ValueError("the model has no children with parameters to measure")
    for name in names:
        if checkpoint:
            setattr(model, name, Checkpointed(getattr(model, name)))
    counter = _Counter({p.untyped_storage().data_ptr() for p in model.parameters()}, len(names))
    for u, name in enumerate(names):
        unit = getattr(model, name)
        unit.register_forward_pre_hook(lambda m, args, u=u: counter.enter(u, checkpoint, args))
        unit.register_forward_hook(lambda m, args, out: counter.leave())
        inner = unit.inner if checkpoint else unit
        inner.register_forward_pre_hook(lambda m, args: setattr(counter, "forwards", counter.forwards + 1))

    def step() -> float:
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            loss = global_mse(model(x), y, y.numel())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    counter.forwards = 0
    step()  # the measured step: bytes and forwards
    saved, forwards = tuple(counter.bytes), counter.forwards
    times = [step() for _ in range(repeats)]
    return ActivationMeasurement(checkpoint, x.shape[0], tuple(names), saved, forwards, statistics.median(times),
                                 sum(saved))
