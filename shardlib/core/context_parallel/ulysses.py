"""All-to-all sequence parallelism on a rank (DeepSpeed-Ulysses, Jacobs et al. 2023): sequence to heads and back.

Each rank starts with its run of tokens for every head, ``(b, H, s/n, hd)``; one all-to-all per tensor
trades it for every token of ``H/n`` heads, ``(b, H/n, s, hd)``; each rank runs plain attention on its
heads; one more all-to-all hands the output back by sequence. Differentiable: an all-to-all is a
permutation (``experts.dispatch.all_to_all``), so the backward of sequence-to-heads is heads-to-sequence
and the other way round.
``n`` must divide the query heads and the KV heads (``check_heads_divide``).
"""

from __future__ import annotations

import torch

from shardlib.core.context_parallel.online_softmax import check_shards
from shardlib.core.experts.dispatch import all_to_all
from shardlib.core.model import attention
from shardlib.core.probe import NO_PROBE


def check_heads_divide(heads: int, kv_heads: int, world_size: int) -> None:
    """A ValueError if ``world_size`` ranks cannot each hold whole query heads and the KV heads they read."""
    problems = [f"{count} {what} heads do not divide among {world_size} ranks ({count} = {world_size} x "
                f"{count // world_size} + {count % world_size})"
                for count, what in ((heads, "query"), (kv_heads, "KV")) if count % world_size]
    if problems:
        raise ValueError("all-to-all sequence parallelism gives each rank whole heads, but " + "; ".join(problems)
                         + ": use a number of ranks that divides both, or ring attention, which splits "
                           "the sequence only")


def sequence_to_heads(ctx, x: torch.Tensor) -> torch.Tensor:
    """``(b, h, s/n, hd)``, every head for my tokens, to ``(b, h/n, s, hd)``, my heads for every token."""
    n = ctx.world_size
    b, h, part, hd = x.shape
    send = x.reshape(b, n, h // n, part, hd).transpose(0, 1).contiguous()  # (n: head group j goes to rank j, ...)
    got = all_to_all(ctx, send, [1] * n, [1] * n)  # (n: the token run of rank i, b, h/n, s/n, hd)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * part, hd)


def heads_to_sequence(ctx, x: torch.Tensor) -> torch.Tensor:
    """The way back: ``(b, h/n, s, hd)`` to ``(b, h, s/n, hd)``."""
    n = ctx.world_size
    b, mine, seq, hd = x.shape
    send = x.reshape(b, mine, n, seq // n, hd).permute(2, 0, 1, 3, 4).contiguous()  # (n: token run j to rank j, ...)
    got = all_to_all(ctx, send, [1] * n, [1] * n)  # (n: the head group of rank i, b, h/n, s/n, hd)
    return got.transpose(0, 1).reshape(b, n * mine, seq // n, hd)


def ulysses_attention(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                      scale: float | None = None, probe=NO_PROBE) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, by two re-shards, differentiable:
    ``q (b, H, s/n, hd)``, ``k, v (b, KV, s/n, hd)`` (contiguous shards) in, ``(b, H, s/n, hd)`` out."""
    _, heads, kv_heads, _, _ = check_shards(q.shape, k.shape, v.shape, ctx.world_size, local=True)
    check_heads_divide(heads, kv_heads, ctx.world_size)
    q_h, k_h, v_h = (sequence_to_heads(ctx, t) for t in (q, k, v))  # (b, H/n, s, hd)
    with probe.span("attention, my heads, whole sequence"):
        out = attention(q_h, k_h, v_h, causal=causal, scale=scale)  # (b, H/n, s, hd)
    return heads_to_sequence(ctx, out)  # (b, H, s/n, hd)
