"""The unsharded attention every context-parallel run is checked against, the input checks, and the
ring played out in one process.

* ``attention_reference``: ``torch.nn.functional.scaled_dot_product_attention`` on the whole sequence,
  causal or not, grouped-query heads included.
* ``check_qkv``: the shape rules of q, k and v, each broken rule a ValueError with the numbers (the
  drivers call it before any rank starts, the rank functions before any message).
* ``shard_sequence``, ``gather_sequence``: cut a tensor into the ranks' shards of a layout, and join them.
* ``simulate_ring_attention``: every rank's ring pass computed here, block by block in ring order,
  with the very code the ranks run (``online_softmax.attend_block``): the ring at any world size
  without processes.
Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..checks import flag
from .layouts import check_sequence, chunks_of_rank, chunks_per_rank
from .online_softmax import attend_block


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                        scale: float | None = None) -> torch.Tensor:
    """Attention of ``q (b, H, s, hd)`` over ``k, v (b, KV, s, hd)`` on the whole sequence, in one call."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=k.shape[1] != q.shape[1])


def check_qkv(q_shape, k_shape, v_shape, what: str = "q, k, v") -> tuple[int, int, int, int, int]:
    """``(batch, heads, kv_heads, seq, head_dim)`` of ``q (b, H, s, hd)``, ``k, v (b, KV, s, hd)``, or a
    ValueError naming the mismatch."""
    shapes = {"q": tuple(q_shape), "k": tuple(k_shape), "v": tuple(v_shape)}
    for name, shape in shapes.items():
        if len(shape) != 4:
            raise ValueError(f"{name} must be 4-d (batch, heads, seq, head_dim), got shape {shape}")
    if shapes["k"] != shapes["v"]:
        raise ValueError(f"k and v must have the same shape, got k {shapes['k']} and v {shapes['v']}")
    (b, heads, s, hd), (kb, kv_heads, ks, khd) = shapes["q"], shapes["k"]
    for label, mine, theirs in (("batch", b, kb), ("sequence length", s, ks), ("head_dim", hd, khd)):
        if mine != theirs:
            raise ValueError(f"{what}: q has {label} {mine} but k and v have {theirs} "
                             f"(q {shapes['q']}, k {shapes['k']})")
    if min(b, heads, kv_heads, s, hd) < 1:
        raise ValueError(f"{what}: every dimension must be at least 1, got q {shapes['q']}, k {shapes['k']}")
    if heads % kv_heads:
        raise ValueError(f"{what}: {heads} query heads cannot share {kv_heads} KV heads evenly (grouped-query "
                         "attention needs the query heads to be a multiple of the KV heads)")
    return b, heads, kv_heads, s, hd


def shard_sequence(t: torch.Tensor, world_size: int, layout: str = "contiguous", dim: int = 2) -> list[torch.Tensor]:
    """Every rank's shard of ``t`` along ``dim`` (default 2: ``(batch, heads, seq, head_dim)``)."""
    size = check_sequence(t.shape[dim], world_size, layout)
    pieces = t.split(size, dim=dim)
    return [torch.cat([pieces[c] for c in chunks_of_rank(r, world_size, layout)], dim=dim)
            for r in range(world_size)]


def gather_sequence(shards, layout: str = "contiguous", dim: int = 2) -> torch.Tensor:
    """The inverse of ``shard_sequence``: the whole tensor, tokens back in sequence order."""
    shards = list(shards)
    n, per = len(shards), chunks_per_rank(layout)
    pieces: dict[int, torch.Tensor] = {}
    for r, shard in enumerate(shards):
        for c, piece in zip(chunks_of_rank(r, n, layout), shard.chunk(per, dim=dim)):
            pieces[c] = piece
    return torch.cat([pieces[c] for c in range(n * per)], dim=dim)


def ring_pass(rank: int, world_size: int, q_shard, kv_blocks, layout: str, causal: bool, scale=None):
    """Rank ``rank``'s whole ring pass in one process: ``kv_blocks[j]`` is rank ``j``'s ``(k, v)`` shard,
    met in ring order (its own first, then rank ``rank - 1``'s, ...). Returns the output shard and the
    blocks computed per step, ``[(source rank, visible, diagonal), ...]``."""
    q_ids = chunks_of_rank(rank, world_size, layout)
    q_chunks = q_shard.chunk(len(q_ids), dim=2)
    acc = [None] * len(q_ids)
    steps = []
    for step in range(world_size):
        src = (rank - step) % world_size
        k, v = kv_blocks[src]
        steps.append((src, *attend_block(acc, q_chunks, q_ids, k, v, chunks_of_rank(src, world_size, layout),
                                         causal, scale)))
    return torch.cat([a.out for a in acc], dim=2), steps


def simulate_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int,
                            causal: bool = True, layout: str = "contiguous", scale: float | None = None) -> torch.Tensor:
    """Ring attention over ``world_size`` simulated ranks, gathered back into sequence order: equal to
    ``attention_reference`` within float32 rounding (the blocks are summed in another order)."""
    check_qkv(q.shape, k.shape, v.shape)
    flag(causal, "causal")
    chunks_per_rank(layout)
    qs = shard_sequence(q, world_size, layout)
    kvs = list(zip(shard_sequence(k, world_size, layout), shard_sequence(v, world_size, layout)))
    outs = [ring_pass(r, world_size, qs[r], kvs, layout, causal, scale)[0] for r in range(world_size)]
    return gather_sequence(outs, layout)
