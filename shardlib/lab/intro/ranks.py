"""Rank functions for the first notebook: who am I, a first all-reduce, and a straggler.

Each runs on a ``Ranks`` pool in a notebook and under ``torchrun``
(``python -m shardlib.runtime.launch shardlib.lab.intro.ranks:first_all_reduce_on_rank``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from shardlib.core.checks import one_per


@dataclass(frozen=True)
class Whoami:
    """Where a rank lives."""

    rank: int
    world_size: int
    pid: int
    device: str
    backend: str
    threads: int


def whoami_on_rank(ctx) -> Whoami:
    """Where this rank lives: its number, its process, its device."""
    return Whoami(ctx.rank, ctx.world_size, os.getpid(), str(ctx.device), ctx.backend, torch.get_num_threads())


@dataclass(frozen=True)
class AllReduced:
    """A rank's values before and after the all-reduce."""

    before: list[float]
    after: list[float]


def first_all_reduce_on_rank(ctx, n: int = 4) -> AllReduced:
    """Rank r starts with ``n`` copies of ``r + 1``; after a sum all-reduce every rank holds
    ``1 + 2 + ... + w = w (w + 1) / 2`` in every position."""
    x = torch.full((n,), float(ctx.rank + 1), device=ctx.device)
    before = x.clone()
    ctx.comm.all_reduce(x)
    return AllReduced(before.tolist(), x.tolist())


def straggler_on_rank(ctx, work_units: list[int], size: int = 256) -> float:
    """Each rank does ``work_units[rank]`` units of matmuls (a ``matmuls`` span), then all ranks all-reduce:
    a rank with less work waits inside the collective for the slowest."""
    one_per(work_units, ctx.world_size, "work_units", "rank")
    a = torch.randn(size, size, device=ctx.device)  # (size, size)
    with ctx.timeline.span("matmuls", units=work_units[ctx.rank]):
        for _ in range(work_units[ctx.rank]):
            for _ in range(8):
                a = torch.tanh(a @ a / size)
    return float(ctx.comm.all_reduce(a.sum(0))[0])  # the first of (size,) sums, the same on every rank


def all_reduce_on_rank(ctx, n_elements: int) -> int:
    """One all-reduce of ``n_elements`` float32 values (4 bytes each); returns its buffer bytes."""
    x = torch.ones(n_elements, device=ctx.device)  # (n_elements,)
    ctx.comm.all_reduce(x)
    return x.numel() * x.element_size()

