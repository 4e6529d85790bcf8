"""Attention one block of keys at a time: partials, their merge, and each block's gradients.

The online softmax (Milakov and Gimelshein 2018) keeps, per query row, the output over the keys seen
so far (``out``, normalised), the largest score ``row_max`` and ``row_sum = sum_j exp(score_j - row_max)``;
two partials over disjoint keys merge exactly (``merge``). ``log(row_sum) + row_max`` is the row's
log-sum-exp, all that the backward keeps. ``block_grads`` is one block of FlashAttention-2's backward (Dao
2023, Algorithm 2): from the saved output and log-sum-exp it rebuilds the block's probabilities and returns
dQ, dK, dV.

Grouped-query attention: queries are viewed as ``(batch, kv_heads, group, rows, head_dim)`` against
keys ``(batch, kv_heads, 1, keys, head_dim)``, so the K/V are never expanded, and a KV head's gradient
sums over the query heads of its group. Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from shardlib.core.context_parallel.placement import DIAGONAL, FUTURE, block_kind, check_sequence, chunks_per_rank


@dataclass(frozen=True)
class Partial:
    """Attention of some query rows over some of the keys: ``out`` (normalised), ``row_max``, ``row_sum``."""

    out: torch.Tensor  # (batch, heads, rows, head_dim)
    row_max: torch.Tensor  # (batch, heads, rows)
    row_sum: torch.Tensor  # (batch, heads, rows)

    @property
    def log_sum_exp(self) -> torch.Tensor:
        return self.row_max + self.row_sum.log()


def _scores(q: torch.Tensor, k: torch.Tensor, diagonal: bool, scale: float | None):
    """``q (b, H, rows, hd)`` grouped by KV head, ``(b, KV, group, rows, hd)``, its scores against ``k (b,
    KV, keys, hd)``, ``(b, KV, group, rows, keys)`` (``-inf`` where key ``j`` is in the future of query ``i <
    j`` of a ``diagonal`` block), and the scale used."""
    b, heads, rows, hd = q.shape
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.reshape(b, k.shape[1], heads // k.shape[1], rows, hd)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).mul_(scale)
    if diagonal:
        scores.masked_fill_(torch.ones(rows, k.shape[2], dtype=torch.bool, device=q.device).triu_(1), float("-inf"))
    return qg, scores, scale


def block_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool = False,
                  scale: float | None = None) -> Partial:
    """Attention of ``q (b, H, rows, hd)`` over one block ``k, v (b, KV, keys, hd)``. ``diagonal``: the
    block holds the same positions as the queries, so key ``j`` is hidden from query ``i < j``.
    Forward only (the scores are reworked in place to save memory)."""
    b, heads, rows, hd = q.shape
    _, scores, _ = _scores(q, k, diagonal, scale)  # (b, KV, group, rows, keys)
    like = {"dtype": scores.dtype, "device": scores.device}
    row_max = scores.amax(dim=-1)  # (b, KV, group, rows): finite, each query sees at least its own key
    weights = scores.sub_(row_max.unsqueeze(-1))  # in place: the block's scores are its largest tensor
    if diagonal:  # exp(-inf) takes a slow path on CPU: clamp, exponentiate, then zero the future exactly
        weights.clamp_min_(-80.0).exp_().mul_(torch.ones(rows, k.shape[2], **like).tril_())
    else:
        weights.exp_()
    row_sum = weights.sum(dim=-1)
    out = (weights @ v.unsqueeze(2)) / row_sum.unsqueeze(-1)  # (b, KV, group, rows, hd)
    return Partial(out.reshape(b, heads, rows, hd), row_max.reshape(b, heads, rows), row_sum.reshape(b, heads, rows))


def merge(a: Partial, b: Partial) -> Partial:
    """The partial over the keys of ``a`` and of ``b`` together (the formula in the module docstring)."""
    row_max = torch.maximum(a.row_max, b.row_max)
    w_a = a.row_sum * torch.exp(a.row_max - row_max)
    w_b = b.row_sum * torch.exp(b.row_max - row_max)
    row_sum = w_a + w_b
    out = (w_a.unsqueeze(-1) * a.out + w_b.unsqueeze(-1) * b.out) / row_sum.unsqueeze(-1)
    return Partial(out, row_max, row_sum)


def _computed_blocks(q_ids, k_ids, causal: bool):
    """``(i, j, diagonal)`` for each query chunk ``q_ids[i]`` against key chunk ``k_ids[j]`` not in its future."""
    for i, a in enumerate(q_ids):
        for j, b in enumerate(k_ids):
            kind = block_kind(a, b, causal)
            if kind != FUTURE:
                yield i, j, kind == DIAGONAL


def attend_block(acc: list, q_chunks, q_ids, k: torch.Tensor, v: torch.Tensor, k_ids, causal: bool,
                 scale: float | None = None) -> None:
    """Fold one K/V shard (chunks ``k_ids`` laid end to end) into ``acc[i]``, the ``Partial`` of this rank's
    query chunk ``q_chunks[i]`` (chunk ``q_ids[i]``; ``None`` before its first block), in place."""
    k_parts, v_parts = k.chunk(len(k_ids), dim=2), v.chunk(len(k_ids), dim=2)
    for i, j, diagonal in _computed_blocks(q_ids, k_ids, causal):
        part = block_partial(q_chunks[i], k_parts[j], v_parts[j], diagonal=diagonal, scale=scale)
        acc[i] = part if acc[i] is None else merge(acc[i], part)


def block_grads(q, d_out, lse, delta, k, v, diagonal: bool = False, scale: float | None = None):
    """One block of the backward: ``(dq, dk, dv)`` of queries ``q (b, H, rows, hd)`` against the block
    ``k, v (b, KV, keys, hd)``, given the upstream gradient ``d_out`` (like ``q``), the rows' final
    log-sum-exp ``lse`` and ``delta = rowsum(d_out * out)`` (``(b, H, rows)`` each)."""
    b, heads, rows, hd = q.shape
    qg, scores, scale = _scores(q, k, diagonal, scale)  # (b, KV, group, rows, hd), (b, KV, group, rows, keys)
    grouped = qg.shape[:-1]
    dog = d_out.reshape(qg.shape)
    k1, v1 = k.unsqueeze(2), v.unsqueeze(2)  # (b, KV, 1, keys, hd)
    p = scores.sub_(lse.reshape(*grouped, 1)).exp_()  # P = exp(S - lse): the softmax, rebuilt
    dv = (p.transpose(-1, -2) @ dog).sum(2)  # dV = P^T dO, summed over the group: (b, KV, keys, hd)
    ds = p * (dog @ v1.transpose(-1, -2) - delta.reshape(*grouped, 1))  # dS = P * (dP - D), dP = dO V^T
    dq = (ds @ k1).mul_(scale).reshape(b, heads, rows, hd)  # dQ = dS K scale
    dk = (ds.transpose(-1, -2) @ qg).sum(2).mul_(scale)  # dK = dS^T Q scale, summed over the group
    return dq, dk, dv


def attend_block_backward(dq: torch.Tensor, dkv: torch.Tensor, rows, q_ids, kv: torch.Tensor, k_ids,
                          causal: bool, scale: float | None = None) -> None:
    """Add one K/V shard's gradients into ``dq`` (this rank's queries) and ``dkv`` (``(2, b, KV, keys, hd)``,
    the shard's travelling dK/dV), in place. ``rows``: this rank's ``(q, d_out, lse, delta)``."""
    per_q = [t.chunk(len(q_ids), dim=2) for t in (dq, *rows)]
    per_k = [t.chunk(len(k_ids), dim=2) for t in (kv[0], kv[1], dkv[0], dkv[1])]
    for i, j, diagonal in _computed_blocks(q_ids, k_ids, causal):
        grads = block_grads(*(t[i] for t in per_q[1:]), per_k[0][j], per_k[1][j], diagonal=diagonal, scale=scale)
        for into, grad in zip((per_q[0][i], per_k[2][j], per_k[3][j]), grads):  # dq, dk, dv
            into.add_(grad)


def check_shards(q_shape, k_shape, v_shape, world_size: int = 1, placement: str = "contiguous",
                 local: bool = False) -> tuple[int, int, int, int, int]:
    """``(batch, heads, kv_heads, seq, head_dim)`` of ``q (b, H, s, hd)``, ``k, v (b, KV, s, hd)``, or a
    ValueError naming the mismatch, or saying why the sequence does not split over ``world_size`` ranks in
    ``placement`` (the whole one, or with ``local`` one rank's shard)."""
    shapes = {"q": tuple(q_shape), "k": tuple(k_shape), "v": tuple(v_shape)}
    for name, shape in shapes.items():
        if len(shape) != 4:
            raise ValueError(f"{name} must be 4-d (batch, heads, seq, head_dim), got shape {shape}")
    if shapes["k"] != shapes["v"]:
        raise ValueError(f"k and v must have the same shape, got k {shapes['k']} and v {shapes['v']}")
    (b, heads, s, hd), (kb, kv_heads, ks, khd) = shapes["q"], shapes["k"]
    for label, mine, theirs in (("batch", b, kb), ("sequence length", s, ks), ("head_dim", hd, khd)):
        if mine != theirs:
            raise ValueError(f"q has {label} {mine} but k and v have {theirs} (q {shapes['q']}, k {shapes['k']})")
    if min(b, heads, kv_heads, s, hd) < 1:
        raise ValueError(f"every dimension must be at least 1, got q {shapes['q']}, k {shapes['k']}")
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads cannot share {kv_heads} KV heads evenly (grouped-query "
                         "attention needs the query heads to be a multiple of the KV heads)")
    if local and s % chunks_per_rank(placement):
        raise ValueError(f"the zigzag placement gives each rank 2 chunks, so a rank's shard of {s} tokens must be "
                         f"even (the whole sequence a multiple of 2 x {world_size} = {2 * world_size})")
    check_sequence(s * world_size if local else s, world_size, placement)
    return b, heads, kv_heads, s, hd
