"""Context parallelism's formulas: bytes per rank of each method, the ring's time, memory per device.

Wire bytes one rank sends per attention call (``runtime.records``' convention), ``n`` ranks, ``b``
sequences of ``s`` tokens, ``H`` query and ``KV`` KV heads of ``hd`` values of ``B`` bytes:

    ring forward     (n-1) K/V blocks                       (n-1) x 2 b KV (s/n) hd B
    ring backward    (n-1) K/V blocks + n dK/dV blocks      (2n-1) x 2 b KV (s/n) hd B   (0 on one rank)
    all-to-all       4 all-to-alls (q, k, v, output)        (n-1)/n x (2H + 2KV) b (s/n) hd B, each pass
    all-gather K/V   2 all-gathers (k, v), not overlapped   the ring's bytes, the whole K/V held

``cp_comm_bytes_per_rank``: Megatron-Core's four ``cp_comm_type``; ``ring_time_s``: alpha-beta, a step
``max(compute, transfer)`` overlapped; ``ring_hiding_tokens``: where a block's attention outlasts its K/V
transfer; ``causal_work``: the blocks each rank computes under a causal mask, per placement. Memory: weights
and KV cache under ``tp x cp`` (the cache splits by token), one ring rank's holdings. Liu et al. 2023,
Jacobs et al. 2023. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from shardlib.core.checks import flag, number_at_least, positive_number, whole_number
from shardlib.core.config import ModelConfig, kv_bytes_per_token
from shardlib.core.context_parallel.placement import (
    DIAGONAL,
    VISIBLE,
    block_kind,
    check_sequence,
    chunks_of_rank,
    chunks_per_rank,
)
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import point_to_point_s
from shardlib.predict.serving.memory import weights_per_gpu
from shardlib.predict.shapes import Memory, kv_cache_bytes


@dataclass(frozen=True)
class AttentionShape:
    """One attention call: ``batch`` sequences of ``seq`` tokens, ``heads`` query heads, ``kv_heads``
    KV heads of ``head_dim`` values of ``bytes_per_value`` bytes."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    bytes_per_value: float = 4.0

    def __post_init__(self) -> None:
        for name in ("batch", "heads", "kv_heads", "seq", "head_dim"):
            whole_number(getattr(self, name), name)
        positive_number(self.bytes_per_value, "bytes_per_value")
        if self.heads % self.kv_heads:
            raise ValueError(f"{self.heads} query heads cannot share {self.kv_heads} KV heads evenly")

    def values_per_token(self, heads: int) -> int:
        return self.batch * heads * self.head_dim

    def kv_block_bytes(self, world_size: int) -> float:
        """One rank's K and V shard, the ring's message: ``2 b KV (s/n) hd B``. With ``world_size`` 1, the
        whole sequence's K and V, which the all-gather method holds on every rank during the call."""
        per_token = kv_bytes_per_token(1, self.kv_heads, self.head_dim, self.bytes_per_value)  # one layer
        return per_token * self.batch * self.seq / world_size


def ring_bytes_per_rank(shape: AttentionShape, world_size: int) -> float:
    """Wire bytes one rank sends in a ring pass: ``n - 1`` K/V blocks."""
    n = whole_number(world_size, "world_size")
    return (n - 1) * shape.kv_block_bytes(n)


def ring_backward_bytes_per_rank(shape: AttentionShape, world_size: int) -> float:
    """Wire bytes one rank sends in the ring's backward: its K/V block passed on ``n - 1`` times, as in
    the forward, and the dK/dV accumulator it holds passed on after each of the ``n`` steps (the last
    hop takes it home), each as large as a K/V block (gradients in the values' dtype): ``(2n - 1)``
    blocks. One rank sends nothing."""
    n = whole_number(world_size, "world_size")
    return 0.0 if n == 1 else (2 * n - 1) * shape.kv_block_bytes(n)


def ring_saved_bytes_per_rank(shape: AttentionShape, world_size: int) -> float:
    """What one rank's ring attention keeps for its backward: its rows of q and of the output, its own K/V
    shard and one log-sum-exp per row, ``b (s/n) ((2H + 2KV) hd + H) B``: ``O(s/n)``, no K/V of other ranks."""
    n = whole_number(world_size, "world_size")
    rows = shape.batch * shape.seq / n
    return rows * ((2 * shape.heads + 2 * shape.kv_heads) * shape.head_dim + shape.heads) * shape.bytes_per_value


def ulysses_bytes_per_rank(shape: AttentionShape, world_size: int) -> float:
    """Wire bytes one rank sends in the four all-to-alls: ``(n-1)/n`` of its q, k, v and output shards."""
    return sum(wire for _, _, wire in ulysses_collectives(shape, world_size))


def ulysses_collectives(shape: AttentionShape, world_size: int) -> list[tuple[str, float, float]]:
    """``(op, size_bytes, wire_bytes)`` of each all-to-all, in order (q, k, v, output): the comm log's
    prediction."""
    n = whole_number(world_size, "world_size")
    out = []
    for heads in (shape.heads, shape.kv_heads, shape.kv_heads, shape.heads):
        size = shape.values_per_token(heads) * shape.seq / n * shape.bytes_per_value
        out.append(("all_to_all_single", size, (n - 1) / n * size))
    return out


def all_gather_kv_collectives(shape: AttentionShape, world_size: int) -> list[tuple[str, float, float]]:
    """``(op, size_bytes, wire_bytes)`` of the all-gather method's two collectives (k, then v), as the comm
    log records them: the gathered output ``b KV s hd B`` each, ``(n-1)/n`` of it on the wire."""
    n = whole_number(world_size, "world_size")
    size = shape.values_per_token(shape.kv_heads) * shape.seq * shape.bytes_per_value
    return [("all_gather", size, (n - 1) / n * size)] * 2


CP_COMM_TYPES = ("p2p", "all_gather", "a2a", "a2a+p2p")


def cp_comm_bytes_per_rank(shape: AttentionShape, world_size: int, inner: int = 2) -> dict[str, float]:
    """Forward wire bytes per rank of each of Megatron-Core's ``cp_comm_type`` values on ``world_size``
    ranks: ``p2p`` (the ring), ``all_gather`` (K/V gathered, Llama 3's choice), ``a2a`` (Ulysses) and
    ``a2a+p2p`` (all-to-all inside groups of ``inner`` ranks, each then holding ``KV / inner`` heads of
    ``s / (n / inner)`` tokens, and the ring across the ``n / inner`` groups). ``a2a`` needs ``n`` to divide
    the KV heads and ``a2a+p2p`` needs ``inner`` to; a method that cannot run is left out."""
    n, a = whole_number(world_size, "world_size"), whole_number(inner, "inner")
    out = {"p2p": ring_bytes_per_rank(shape, n),
           "all_gather": sum(wire for _, _, wire in all_gather_kv_collectives(shape, n))}  # the ring's bytes
    if shape.kv_heads % n == 0:
        out["a2a"] = ulysses_bytes_per_rank(shape, n)
    if 1 < a < n and n % a == 0 and shape.kv_heads % a == 0:
        outer = n // a
        a2a = (a - 1) / a * (2 * shape.heads + 2 * shape.kv_heads) * shape.batch * shape.head_dim * shape.seq / n
        per_token = kv_bytes_per_token(1, shape.kv_heads // a, shape.head_dim, 1.0)  # values, one layer
        ring = (outer - 1) * per_token * shape.batch * shape.seq / outer
        out["a2a+p2p"] = (a2a + ring) * shape.bytes_per_value
    return out


def ring_time_s(compute_s: Sequence[float], transfer_s: float, overlap: bool = True) -> float:
    """The ring's predicted time from the slowest rank's compute per step (``compute_s``, one entry per
    step) and one block's transfer time (the formula in the module docstring)."""
    steps = [number_at_least(c, "compute time of a step") for c in compute_s]
    if not steps:
        raise ValueError("a ring pass has at least one step")
    t = number_at_least(transfer_s, "transfer_s")
    moving = steps[:-1]
    body = sum(max(c, t) for c in moving) if flag(overlap, "overlap") else sum(c + t for c in moving)
    return body + steps[-1]


def ring_transfer_s(shape: AttentionShape, world_size: int, link: Link) -> float:
    """One K/V block sent to the next rank over ``link``: ``alpha + bytes / bandwidth``."""
    return point_to_point_s(shape.kv_block_bytes(world_size), link)


def hidden_share(waited_s: float, exposed_s: float) -> float:
    """The share of a transfer hidden under compute: 1 minus the time still spent waiting for it
    (``waited_s``, overlapped) over the time it took when nothing overlapped it (``exposed_s``),
    between 0 and 1."""
    waited, exposed = number_at_least(waited_s, "waited_s"), positive_number(exposed_s, "exposed_s")
    return min(1.0, max(0.0, 1.0 - waited / exposed))


def ring_block_attention_s(tokens_per_rank: float, heads: int, head_dim: int, flops_per_s: float) -> float:
    """One ring step's attention for one sequence and one layer, a full (unmasked) block of ``c`` queries
    against ``c`` keys: ``q k^T`` and the weighted sum of ``v``, ``4 c^2 H hd`` FLOPs at ``flops_per_s``."""
    c = positive_number(tokens_per_rank, "tokens_per_rank")
    return 4 * c * c * whole_number(heads, "heads") * whole_number(head_dim, "head_dim") / positive_number(
        flops_per_s, "flops_per_s")


def ring_hiding_tokens(heads: int, kv_heads: int, head_dim: int, bytes_per_value: float, flops_per_s: float,
                       link: Link) -> int:
    """The fewest tokens per rank ``c`` at which one block's attention (``ring_block_attention_s``) lasts at
    least as long as sending its K/V block (``2 c KV hd B`` bytes, ``alpha + bytes / bandwidth`` over
    ``link``): from there on the overlapped ring hides the transfer. Compute grows as ``c^2``, bytes as
    ``c``, so there is one crossing; found by bisection on whole tokens."""
    AttentionShape(1, heads, kv_heads, 1, head_dim, bytes_per_value)  # the shape's checks

    def hidden(c: int) -> bool:
        transfer = point_to_point_s(c * kv_bytes_per_token(1, kv_heads, head_dim, bytes_per_value), link)
        return ring_block_attention_s(c, heads, head_dim, flops_per_s) >= transfer

    low, high = 0, 1
    while not hidden(high):
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if hidden(mid) else (mid, high)
    return high


# -- the ring's causal work per rank ---------------------------------------------------------------------
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


# -- memory per device ------------------------------------------------------------------------------------
def device_memory(model: ModelConfig, seq: int, batch: int = 1, tp: int = 1, cp: int = 1) -> Memory:
    """Weights and KV cache on one device of a ``tp x cp`` layout (the serving planner's ``Memory``): the
    weights split ``tp`` ways (``weights_per_gpu``) and copied on every context-parallel rank, the cache
    split both ways."""
    tp, cp = whole_number(tp, "tp"), whole_number(cp, "cp")
    return Memory(weights_per_gpu(model, Layout(tp, 1)), kv_cache_bytes(model, seq, batch, tp, cp))


def context_parallel_needed(model: ModelConfig, seq: int, memory_per_device_bytes: float, batch: int = 1,
                            tp: int = 1, max_cp: int = 64) -> int:
    """The smallest ``cp`` (a power of two up to ``max_cp``) at which ``seq`` tokens' KV cache and the
    weights fit in ``memory_per_device_bytes`` with ``tp``-way tensor parallelism; a ValueError with
    the numbers when none does (the weights alone may not fit: then no ``cp`` helps)."""
    cap = positive_number(memory_per_device_bytes, "memory_per_device_bytes")
    cp = 1
    while cp <= max_cp:
        if device_memory(model, seq, batch, tp, cp).total_bytes <= cap:
            return cp
        cp *= 2
    best = device_memory(model, seq, batch, tp, max_cp)
    raise ValueError(f"{model.name} with tp = {tp} and {seq:,} tokens does not fit {cap / 1e9:.0f} GB per device "
                     f"even at cp = {max_cp}: weights {best.weights_bytes / 1e9:.1f} GB + KV cache "
                     f"{best.kv_cache_bytes / 1e9:.1f} GB")


def attention_bytes_per_rank(shape: AttentionShape, world_size: int = 1,
                             placement: str = "contiguous") -> dict[str, float]:
    """What one rank holds during one attention call on ``shape``, part by part. One rank (``world_size``
    1): q, k, v, the output and the whole score matrix, as a plain implementation materialises it. A
    ring rank: its rows of q and the output, its own K/V shard, the next one arriving (the ring's only
    extra), and the scores of one block, a chunk of queries against a chunk of keys."""
    n = whole_number(world_size, "world_size")
    chunk = check_sequence(shape.seq, n, placement) if n > 1 else shape.seq
    b, hd, B = shape.batch, shape.head_dim, shape.bytes_per_value
    rows = shape.seq / n
    parts = {"q and output rows": 2 * b * shape.heads * rows * hd * B, "own K/V": shape.kv_block_bytes(n)}
    if n > 1:
        parts["K/V arriving"] = shape.kv_block_bytes(n)
    parts["scores"] = b * shape.heads * (chunk if n > 1 else shape.seq) ** 2 * B
    return parts
