"""Flat groups: parameters laid end to end in one buffer, padded so that ``dp`` ranks split it evenly.

As in PyTorch's DDP (gradient buckets, Li et al. 2020) and ZeRO (Rajbhandari et al. 2020): one collective
per buffer, not per tensor. A ``FlatGroup`` says which parameters sit in one buffer, where each starts,
and how the buffer is cut among the ranks::

    buffer     | p3 (12) | p2 (4) | p1 (5) | pad (3) |        padded_numel = 24, dp = 4
    rank r     |  0..6   |  6..12 | 12..18 | 18..24  |        shard_numel  = 6: rank r owns r*6..(r+1)*6

``plan_buckets``: DDP's and ZeRO-1/2's buckets, parameters in reverse order (the order the backward
finishes them) up to ``bucket_bytes``. ``plan_units``: ZeRO-3's units, one per layer. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # the plans are pure: the planners import them without torch
    from torch import nn

from shardlib.core.checks import positive_number, whole_number

STRATEGY_TITLES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


@dataclass(frozen=True)
class FlatGroup:
    """Parameters ``params`` (indices into the model's list) laid end to end, ``params[i]`` at ``offsets[i]``;
    the buffer holds ``padded_numel`` elements, a multiple of ``dp``, zeros after the last parameter."""

    index: int
    params: tuple[int, ...]
    offsets: tuple[int, ...]
    numels: tuple[int, ...]
    padded_numel: int
    dp: int

    numel = property(lambda self: sum(self.numels))  # the padding left out
    shard_numel = property(lambda self: self.padded_numel // self.dp)  # what each rank owns

    def owned(self, rank: int) -> tuple[int, int]:
        """``(start, stop)`` of rank ``rank``'s shard in the buffer."""
        whole_number(rank, "rank", 0)
        if rank >= self.dp:
            raise ValueError(f"rank {rank} is outside a group split {self.dp} ways (ranks 0..{self.dp - 1})")
        return rank * self.shard_numel, (rank + 1) * self.shard_numel


def padded(numel: int, dp: int) -> int:
    """``numel`` rounded up to a multiple of ``dp`` (at least ``dp``: every rank owns one element or more)."""
    return max(dp, -(-numel // dp) * dp)


def _group(index: int, params: Sequence[int], numels: Sequence[int], dp: int) -> FlatGroup:
    offsets, at = [], 0
    for i in params:
        offsets.append(at)
        at += numels[i]
    return FlatGroup(index, tuple(params), tuple(offsets), tuple(numels[i] for i in params), padded(at, dp), dp)


def plan_buckets(numels: Sequence[int], element_bytes: int, dp: int,
                 bucket_bytes: float | None = None) -> tuple[FlatGroup, ...]:
    """Gradient buckets over ``dp`` ranks for parameters of ``numels`` elements (registration order), taken
    in reverse (the backward finishes the last layer first), each bucket filled until the next parameter
    would pass ``bucket_bytes`` (``None``: one bucket). Smaller buckets start sending earlier in the
    backward but pay more per-call latency."""
    cap = None if bucket_bytes is None else positive_number(bucket_bytes, "bucket_bytes")
    buckets: list[list[int]] = [[]]
    size = 0
    for i in reversed(range(len(numels))):
        nbytes = numels[i] * element_bytes
        if cap is not None and buckets[-1] and size + nbytes > cap:
            buckets.append([])
            size = 0
        buckets[-1].append(i)
        size += nbytes
    return tuple(_group(k, b, numels, dp) for k, b in enumerate(buckets))


def plan_units(unit_params: Sequence[Sequence[int]], numels: Sequence[int], dp: int) -> tuple[FlatGroup, ...]:
    """ZeRO-3's flat groups: one per unit, ``unit_params[u]`` the indices of unit ``u``'s parameters."""
    seen = [i for unit in unit_params for i in unit]
    if sorted(seen) != list(range(len(numels))):
        raise ValueError(f"the units must hold every parameter exactly once; they hold {sorted(seen)} of "
                         f"{len(numels)} parameters")
    return tuple(_group(k, list(unit), numels, dp) for k, unit in enumerate(unit_params))


def parameter_units(model: nn.Module) -> list[tuple[str, list[str]]]:
    """How ZeRO-3 cuts ``model``, as ``(module name, [parameter names])``: the model's own parameters, if
    any, as unit ``""``, then one unit per direct child that holds parameters."""
    units = [(name, [f"{name}.{p}" for p, _ in child.named_parameters()]) for name, child in model.named_children()]
    units = [(name, params) for name, params in units if params]
    own = [name for name, _ in model.named_parameters(recurse=False)]
    return ([("", own)] if own else []) + units
