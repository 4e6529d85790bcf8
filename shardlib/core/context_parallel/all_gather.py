"""All-gather K/V context parallelism on a rank (Llama 3, Dubey et al. 2024, section 3.3.2): gather, then attend.

Each rank holds its queries and its keys and values for a run of tokens. It all-gathers the K and V of
every rank, so it holds the whole sequence's K/V for a moment, and attends its own queries to them, with
the causal mask offset by where its queries sit. One all-gather each for K and V, not overlapped with
compute (Megatron-Core's ``cp_comm_type="all_gather"``). Only the KV heads travel, so grouped-query
attention (Llama 3: 8 KV heads for 64 or 128 query heads) keeps the gathered K/V small. Differentiable:
the backward of an all-gather is a reduce-scatter of the gradients, summing every rank's share of dK/dV.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.context_parallel.online_softmax import check_qkv
from shardlib.core.context_parallel.placement import check_sequence


def check_all_gather_inputs(q_shape, k_shape, v_shape, world_size: int, local: bool) -> None:
    """Shapes, and a sequence that splits into ``world_size`` contiguous runs (whole, or one rank's run)."""
    _, _, _, seq, _ = check_qkv(q_shape, k_shape, v_shape)
    check_sequence(seq * world_size if local else seq, world_size)


class GatherKV(torch.autograd.Function):
    """All-gather along the sequence forward; reduce-scatter of the gradient backward (each rank keeps
    the sum over ranks of the gradient of its own tokens' K or V)."""

    @staticmethod
    def forward(fn, ctx, x):  # x (b, KV, s/n, hd) -> (b, KV, s, hd)
        fn.rank_ctx = ctx
        return ctx.comm.all_gather(x, dim=2)

    @staticmethod
    def backward(fn, grad):  # grad (b, KV, s, hd) -> (b, KV, s/n, hd)
        return None, fn.rank_ctx.comm.reduce_scatter(grad.contiguous(), dim=2)


def all_gather_kv_attention(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                            scale: float | None = None) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence: ``q (b, H, s/n, hd)``, ``k, v (b, KV, s/n,
    hd)`` (contiguous shards, rank order) in, ``(b, H, s/n, hd)`` out. The whole K/V lives on every rank
    for the length of this call."""
    check_all_gather_inputs(q.shape, k.shape, v.shape, ctx.world_size, local=True)
    k_all, v_all = GatherKV.apply(ctx, k), GatherKV.apply(ctx, v)  # (b, KV, s, hd) each
    part, seq = q.shape[2], k_all.shape[2]
    mask = None
    if causal:  # query i of this rank sits at position rank * s/n + i
        rows = torch.arange(part, device=q.device) + ctx.rank * part  # (s/n,)
        mask = rows[:, None] >= torch.arange(seq, device=q.device)[None, :]  # (s/n, s)
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])
