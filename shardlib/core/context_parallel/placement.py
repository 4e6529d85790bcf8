"""Token placement: which tokens each rank holds, contiguous or zigzag, and each rank's shard cut and joined.

The zigzag placement (Llama 3 training, ring-flash-attention; striped attention, Brandon et al. 2023,
is its cousin token by token) cuts the sequence into ``2 x world_size`` chunks and gives rank ``r``
chunks ``r`` and ``2 world_size - 1 - r``, so that under a causal mask every rank holds the same
amount of past. A rank's shard is its chunks laid end to end (``shard_sequence``).

A query chunk ``a`` against a key chunk ``b`` is *visible* (``b < a``), *diagonal* (``b == a``, computed
under the causal mask) or *future* (``b > a``, skipped); ``predict.context_parallel`` counts them.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import choice, whole_number

PLACEMENTS = ("contiguous", "zigzag")
VISIBLE, DIAGONAL, FUTURE = "visible", "diagonal", "future"


def chunks_per_rank(placement: str) -> int:
    """1 for the contiguous placement, 2 for zigzag."""
    return 1 if choice(placement, PLACEMENTS, "placement") == "contiguous" else 2


def check_sequence(seq: int, world_size: int, placement: str = "contiguous") -> int:
    """The length of one chunk, or a ValueError saying why ``seq`` does not split."""
    whole_number(seq, "sequence length")
    pieces = whole_number(world_size, "world_size") * chunks_per_rank(placement)
    if seq % pieces:
        how = (f"{world_size} ranks" if placement == "contiguous" else
               f"2 x {world_size} = {pieces} chunks (the zigzag placement gives each of the {world_size} ranks two)")
        raise ValueError(f"a sequence of {seq} tokens does not split evenly into {how}: {seq} = {pieces} x "
                         f"{seq // pieces} + {seq % pieces}; use a length that is a multiple of {pieces}")
    return seq // pieces


def chunks_of_rank(rank: int, world_size: int, placement: str = "contiguous") -> tuple[int, ...]:
    """The chunk indices rank ``rank`` holds, in order (see the module docstring)."""
    n = whole_number(world_size, "world_size")
    if whole_number(rank, "rank", 0) >= n:
        raise ValueError(f"rank {rank} is outside a group of {n} ranks")
    return (rank,) if chunks_per_rank(placement) == 1 else (rank, 2 * n - 1 - rank)


def positions_of_rank(rank: int, world_size: int, seq: int, placement: str = "contiguous") -> list[int]:
    """The sequence positions of rank ``rank``'s shard, in the order the shard holds them."""
    size = check_sequence(seq, world_size, placement)
    return [c * size + i for c in chunks_of_rank(rank, world_size, placement) for i in range(size)]


def block_kind(q_chunk: int, k_chunk: int, causal: bool = True) -> str:
    """How query chunk ``q_chunk`` attends to key chunk ``k_chunk`` (see the module docstring)."""
    if not causal or k_chunk < q_chunk:
        return VISIBLE
    return DIAGONAL if k_chunk == q_chunk else FUTURE


def shard_sequence(t: torch.Tensor, world_size: int, placement: str = "contiguous", dim: int = 2) -> list[torch.Tensor]:
    """Every rank's shard of ``t`` along ``dim`` (default 2: ``(batch, heads, seq, head_dim)``)."""
    size = check_sequence(t.shape[dim], world_size, placement)
    pieces = t.split(size, dim=dim)
    return [torch.cat([pieces[c] for c in chunks_of_rank(r, world_size, placement)], dim=dim)
            for r in range(world_size)]


def gather_sequence(shards, placement: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The inverse of ``shard_sequence``: the whole tensor, tokens back in sequence order."""
    shards = list(shards)
    n, per = len(shards), chunks_per_rank(placement)
    pieces: dict[int, torch.Tensor] = {}
    for r, shard in enumerate(shards):
        for c, piece in zip(chunks_of_rank(r, n, placement), shard.chunk(per, dim=dim)):
            pieces[c] = piece
    return torch.cat([pieces[c] for c in range(n * per)], dim=dim)
