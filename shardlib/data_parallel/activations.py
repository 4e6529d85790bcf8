"""Activations measured on one process: the bytes each layer keeps for its backward, with and without
recomputation (Chen et al. 2016; ``torch.utils.checkpoint``).

``measure_activations`` counts, per unit (``reference.parameter_units``), the bytes autograd saves
while the unit's forward runs (``runtime.measure.SavedBytes``: weights left out, a tensor saved twice
counted once), and how many unit forwards one step ran. A checkpointed unit keeps only its input,
which ``torch.utils.checkpoint`` saves through the same hooks. Set beside ``predict.mlp_activation_bytes``.
Torch, one process, no ranks.
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
from ..runtime.measure import SavedBytes
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
    param_ptrs = {p.data_ptr() for p in model.parameters()}
    counters: list[SavedBytes] = []  # per unit: what it saves, counted while its forward runs
    forwards = [0]

    def count_from(u: int) -> None:  # a forward pre-hook returns None, or its value replaces the input
        counters[u].__enter__()

    for u, name in enumerate(names):
        unit = getattr(model, name)
        unit.register_forward_pre_hook(lambda m, args, u=u: count_from(u))
        unit.register_forward_hook(lambda m, args, out, u=u: counters[u].__exit__(None, None, None))
        inner = unit.inner if checkpoint else unit
        inner.register_forward_pre_hook(lambda m, args: forwards.__setitem__(0, forwards[0] + 1))

    def step() -> float:
        counters[:] = [SavedBytes(param_ptrs) for _ in names]
        forwards[0] = 0
        start = time.perf_counter()
        loss = global_mse(model(x), y, y.numel())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    step()  # the measured step: bytes and forwards
    saved, n_forwards = tuple(c.size_bytes for c in counters), forwards[0]
    times = [step() for _ in range(repeats)]
    return ActivationMeasurement(checkpoint, x.shape[0], tuple(names), saved, n_forwards, statistics.median(times),
                                 sum(saved))
