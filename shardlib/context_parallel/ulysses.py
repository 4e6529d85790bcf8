"""All-to-all sequence parallelism on a rank (DeepSpeed-Ulysses): re-shard from sequence to heads and back.

DeepSpeed-Ulysses (Jacobs et al. 2023) takes the other road to a long sequence. Each rank starts with
its run of tokens for *every* head, ``(batch, heads, seq / n, head_dim)``. One all-to-all per tensor
trades that for *every* token of ``heads / n`` heads, ``(batch, heads / n, seq, head_dim)``; attention
of a head needs nothing from any other head, so each rank then runs ordinary attention on the whole
sequence for its heads, and one more all-to-all hands the output back by sequence. Four all-to-alls
(q, k, v in, the output out), each sending ``(n-1)/n`` of what the rank holds: the bytes per rank
*shrink* as ranks are added, where the ring's stay the same.

The limit is in the cut: a rank needs whole heads, so ``n`` must divide the query heads and, with
grouped-query attention, the KV heads too (query heads ``j H/n ..`` read KV heads ``j KV/n ..``, which
must sit on the same rank). Llama-3-70B's 8 KV heads stop it at 8 ranks; the ring has no such wall.
``check_heads_divide`` refuses a split that breaks it, with the numbers, before any collective.
"""

from __future__ import annotations

import torch

from .layouts import check_sequence
from .reference import attention_reference, check_qkv


def check_heads_divide(heads: int, kv_heads: int, world_size: int) -> None:
    """A ValueError if ``world_size`` ranks cannot each hold whole query heads and the KV heads they read."""
    problems = [f"{count} {what} heads do not divide among {world_size} ranks ({count} = {world_size} x "
                f"{count // world_size} + {count % world_size})"
                for count, what in ((heads, "query"), (kv_heads, "KV")) if count % world_size]
    if problems:
        raise ValueError("all-to-all sequence parallelism gives each rank whole heads, but " + "; ".join(problems)
                         + ": use a number of ranks that divides both, or ring attention, which splits "
                           "the sequence only")


def check_ulysses_inputs(q_shape, k_shape, v_shape, world_size: int, local: bool) -> None:
    """Shapes, heads that divide, and a sequence that splits (whole, or one rank's shard when ``local``)."""
    _, heads, kv_heads, seq, _ = check_qkv(q_shape, k_shape, v_shape)
    check_heads_divide(heads, kv_heads, world_size)
    check_sequence(seq * world_size if local else seq, world_size)


def sequence_to_heads(ctx, x: torch.Tensor) -> torch.Tensor:
    """``(b, h, s/n, hd)``, every head for my tokens, to ``(b, h/n, s, hd)``, my heads for every token."""
    n = ctx.world_size
    b, h, part, hd = x.shape
    send = x.reshape(b, n, h // n, part, hd).transpose(0, 1).contiguous()  # (n: head group j goes to rank j, ...)
    got = ctx.comm.all_to_all_single(send)  # (n: the token run of rank i, b, h/n, s/n, hd)
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // n, n * part, hd)


def heads_to_sequence(ctx, x: torch.Tensor) -> torch.Tensor:
    """The way back: ``(b, h/n, s, hd)`` to ``(b, h, s/n, hd)``."""
    n = ctx.world_size
    b, mine, seq, hd = x.shape
    send = x.reshape(b, mine, n, seq // n, hd).permute(2, 0, 1, 3, 4).contiguous()  # (n: token run j to rank j, ...)
    got = ctx.comm.all_to_all_single(send)  # (n: the head group of rank i, b, h/n, s/n, hd)
    return got.transpose(0, 1).reshape(b, n * mine, seq // n, hd)


def ulysses_attention(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                      scale: float | None = None) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, by two re-shards: ``q (b, H, s/n, hd)``,
    ``k, v (b, KV, s/n, hd)`` (contiguous shards) in, ``(b, H, s/n, hd)`` out."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=True)
    q_h, k_h, v_h = (sequence_to_heads(ctx, t) for t in (q, k, v))  # (b, heads / n, s, hd)
    with ctx.timeline.span("attention, my heads, whole sequence"):
        out = attention_reference(q_h, k_h, v_h, causal, scale)
    return heads_to_sequence(ctx, out)


def ulysses_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                              scale: float | None = None) -> dict:
    """``ulysses_attention`` on this rank's contiguous shard of the whole ``q, k, v``. Returns ``output``
    (my rows) and ``collectives``: ``(op, size_bytes, wire_bytes)`` of each call."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=False)
    n, me = ctx.world_size, ctx.rank
    mine = [t.chunk(n, dim=2)[me].to(ctx.device) for t in (q, k, v)]
    out = ulysses_attention(ctx, *mine, causal=causal, scale=scale)
    return {"output": out, "collectives": [(c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records]}
