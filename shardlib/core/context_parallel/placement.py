"""Token placement: which tokens each rank holds, contiguous or zigzag, and the causal blocks each computes.

The zigzag placement (Llama 3 training, ring-flash-attention; striped attention, Brandon et al. 2023,
is its cousin token by token) cuts the sequence into ``2 x world_size`` chunks and gives rank ``r``
chunks ``r`` and ``2 world_size - 1 - r``, so that under a causal mask every rank holds the same
amount of past. A rank's shard is its chunks laid end to end (``reference.shard_sequence``).

A query chunk ``a`` against a key chunk ``b`` is *visible* (``b < a``), *diagonal* (``b == a``, computed
under the causal mask) or *future* (``b > a``, skipped). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def blocks_between(q_rank: int, k_rank: int, world_size: int, placement: str = "contiguous",
                   causal: bool = True) -> tuple[int, int]:
    """``(visible, diagonal)``: the blocks rank ``q_rank``'s queries compute against rank ``k_rank``'s keys."""
    kinds = [block_kind(a, b, causal) for a in chunks_of_rank(q_rank, world_size, placement)
             for b in chunks_of_rank(k_rank, world_size, placement)]
    return kinds.count(VISIBLE), kinds.count(DIAGONAL)


@dataclass(frozen=True)
class RankWork:
    """One rank's blocks over a whole ring pass: ``visible``, ``diagonal`` (masked: full cost, half of it
    useful) and ``skipped`` future ones, each ``chunk`` tokens square."""

    rank: int
    visible: int
    diagonal: int
    skipped: int
    chunk: int

    @property
    def computed_pairs(self) -> int:
        """Blocks computed: what the time follows (a masked block costs as much as a whole one)."""
        return self.visible + self.diagonal

    @property
    def scores(self) -> int:
        """Query-key scores computed (masked ones included), per head."""
        return self.computed_pairs * self.chunk ** 2


def causal_work(seq: int, world_size: int, placement: str = "contiguous", causal: bool = True) -> list[RankWork]:
    """Per rank, the blocks it computes over a ring pass of ``seq`` tokens. Contiguous and causal: rank
    ``r`` computes ``r`` whole blocks and one diagonal; zigzag: every rank the same."""
    size = check_sequence(seq, world_size, placement)
    pairs = chunks_per_rank(placement) ** 2 * world_size
    out = []
    for r in range(world_size):
        counts = [blocks_between(r, j, world_size, placement, causal) for j in range(world_size)]
        visible, diagonal = sum(c[0] for c in counts), sum(c[1] for c in counts)
        out.append(RankWork(r, visible, diagonal, pairs - visible - diagonal, size))
    return out


def imbalance(work) -> float:
    """The busiest rank's computed blocks over the mean: 1 is perfectly even."""
    counts = [w.scores for w in work]
    return max(counts) * len(counts) / sum(counts)
