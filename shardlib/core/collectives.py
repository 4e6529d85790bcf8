"""The ring all-reduce, written out: a reduce-scatter, then an all-gather, over point-to-point sends.

Patarasuk and Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations". The
``n`` ranks stand in a ring; each cuts its tensor into ``n`` chunks. In the reduce-scatter, at each of
``n - 1`` steps every rank sends one chunk to the next rank and adds the chunk arriving from the previous
one; afterwards rank ``r`` holds the full sum of chunk ``r + 1`` (mod ``n``). In the all-gather, ``n - 1``
more steps pass the summed chunks round the ring. Each rank sends ``2(n-1)`` chunks of ``S / n`` bytes:
``2(n-1)/n * S`` in ``2(n-1)`` steps, the alpha-beta formula of ``predict.alpha_beta``. The sum is taken
in another order than ``dist.all_reduce``'s, so floats may differ in the last bits; integers are exact.
"""

from __future__ import annotations

import torch


def ring_step(comm, rank: int, n: int, outgoing: torch.Tensor, arriving: torch.Tensor) -> torch.Tensor:
    """One ring step: ``outgoing`` to rank ``rank + 1`` while ``arriving`` fills from rank ``rank - 1``."""
    pending = (comm.isend(outgoing, (rank + 1) % n), comm.irecv(arriving, (rank - 1) % n))
    for p in pending:
        p.wait()
    return arriving


def ring_chunks(n: int, rank: int, step: int) -> tuple[int, int]:
    """At ring step ``step`` (0 .. 2n - 3), the chunk ``rank`` sends on and the chunk that arrives from
    ``rank - 1``. Reduce-scatter (steps 0 .. n - 2): chunk ``rank - step`` goes on, ``rank - step - 1``
    arrives to be added. All-gather (the next n - 1 steps, counted again from 0): the summed chunk
    ``rank + 1 - step`` goes on, ``rank - step`` arrives. The run and its figure both read this."""
    s, ahead = (step, 0) if step < n - 1 else (step - (n - 1), 1)
    return (rank + ahead - s) % n, (rank + ahead - s - 1) % n


def ring_all_reduce(ctx, x: torch.Tensor) -> torch.Tensor:
    """The sum of ``x`` over the ranks of ``ctx`` (``ctx.comm``, ``ctx.rank``, ``ctx.world_size``), on every
    rank, as a new tensor of ``x``'s shape. ``ctx=None``: one rank, whose sum is ``x`` itself."""
    n = 1 if ctx is None else ctx.world_size
    if n == 1:
        return x.clone()
    rank = ctx.rank
    chunks = list(x.detach().flatten().clone().tensor_split(n))  # n views of (numel / n,)
    for step in range(2 * (n - 1)):
        out, into = (chunks[c] for c in ring_chunks(n, rank, step))
        arriving = ring_step(ctx.comm, rank, n, out, torch.empty_like(into))
        if step < n - 1:
            into += arriving  # reduce-scatter: add the partial sum
        else:
            into.copy_(arriving)  # all-gather: keep the finished sum
    return torch.cat(chunks).view_as(x)
