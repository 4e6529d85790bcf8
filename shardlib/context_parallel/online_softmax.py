"""Attention one block of keys at a time: partial results and how to merge them (online softmax).

Softmax needs the whole row of scores, but a rank of a ring holds only one block of keys at a time.
The online softmax (Milakov and Gimelshein 2018, "Online normalizer calculation for softmax"; the
same algebra makes FlashAttention and Ring Attention, Liu et al. 2023, exact) keeps, per query row,
three things about the keys seen so far:

* ``out``: the attention output over those keys alone, normalised ``(batch, heads, rows, head_dim)``;
* ``row_max``: the largest score ``m`` ``(batch, heads, rows)``;
* ``row_sum``: ``l = sum_j exp(score_j - m)`` ``(batch, heads, rows)``.

Two partials over disjoint sets of keys merge into the partial over their union::

    m = max(m_a, m_b)
    w_a = l_a exp(m_a - m),  w_b = l_b exp(m_b - m)      (each side's share of the new normaliser)
    l = w_a + w_b
    out = (w_a out_a + w_b out_b) / l

Subtracting the max keeps every ``exp`` at most 1 (no overflow), and the result does not depend on the
order in which blocks arrive, up to float rounding. ``log(l) + m`` is the row's log-sum-exp: what a
backward pass would keep.

Grouped-query attention: ``k`` and ``v`` carry ``kv_heads`` heads, each read by ``heads / kv_heads``
query heads. The blocks are never expanded: queries are viewed as ``(batch, kv_heads, group, rows,
head_dim)`` against keys ``(batch, kv_heads, 1, keys, head_dim)``, so only the small K/V travel.
Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .layouts import DIAGONAL, FUTURE, block_kind


@dataclass(frozen=True)
class Partial:
    """Attention of some query rows over some of the keys: ``out`` (normalised), ``row_max``, ``row_sum``."""

    out: torch.Tensor  # (batch, heads, rows, head_dim)
    row_max: torch.Tensor  # (batch, heads, rows)
    row_sum: torch.Tensor  # (batch, heads, rows)

    @property
    def log_sum_exp(self) -> torch.Tensor:
        return self.row_max + self.row_sum.log()


def block_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, diagonal: bool = False,
                  scale: float | None = None) -> Partial:
    """Attention of ``q (b, H, rows, hd)`` over one block ``k, v (b, KV, keys, hd)``. ``diagonal``: the
    block holds the same positions as the queries, so key ``j`` is hidden from query ``i < j``.
    Forward only (the scores are reworked in place to save memory)."""
    b, heads, rows, hd = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(hd) if scale is None else scale
    qg = q.reshape(b, kv_heads, heads // kv_heads, rows, hd)  # (b, KV, group, rows, hd)
    scores = (qg @ k.unsqueeze(2).transpose(-1, -2)).mul_(scale)  # (b, KV, group, rows, keys)
    like = {"dtype": scores.dtype, "device": scores.device}
    if diagonal:  # key j is in the future of query i < j: score -inf
        scores.add_(torch.full((rows, keys), float("-inf"), **like).triu_(1))
    row_max = scores.amax(dim=-1)  # (b, KV, group, rows): finite, each query sees at least its own key
    weights = scores.sub_(row_max.unsqueeze(-1))  # in place: the block's scores are its largest tensor
    if diagonal:  # exp(-inf) takes a slow path on CPU: clamp, exponentiate, then zero the future exactly
        weights.clamp_min_(-80.0).exp_().mul_(torch.ones(rows, keys, **like).tril_())
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


def attend_block(acc: list, q_chunks, q_ids, k: torch.Tensor, v: torch.Tensor, k_ids, causal: bool,
                 scale: float | None = None) -> tuple[int, int]:
    """Fold one rank's block of keys into the accumulators of this rank's query chunks.

    ``q_chunks`` are this rank's query chunks (sequence-chunk indices ``q_ids``); ``k, v`` a whole K/V
    shard made of chunks ``k_ids``, laid end to end; ``acc[i]`` is the ``Partial`` of query chunk ``i``
    so far (``None`` before its first block), updated in place. Future blocks are skipped. Returns
    ``(visible, diagonal)``: the blocks computed."""
    k_parts, v_parts = k.chunk(len(k_ids), dim=2), v.chunk(len(k_ids), dim=2)
    visible = diagonal = 0
    for i, (q_part, a) in enumerate(zip(q_chunks, q_ids)):
        for k_part, v_part, b in zip(k_parts, v_parts, k_ids):
            kind = block_kind(a, b, causal)
            if kind == FUTURE:
                continue
            part = block_partial(q_part, k_part, v_part, diagonal=kind == DIAGONAL, scale=scale)
            acc[i] = part if acc[i] is None else merge(acc[i], part)
            visible, diagonal = visible + (kind != DIAGONAL), diagonal + (kind == DIAGONAL)
    return visible, diagonal
