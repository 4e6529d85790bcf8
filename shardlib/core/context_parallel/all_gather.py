"""All-gather K/V context parallelism on a rank (Llama 3, Dubey et al. 2024, section 3.3.2): gather, then attend.

Each rank holds its queries and its keys and values for a run of tokens. It all-gathers the K and V of
every rank, so it holds the whole sequence's K/V for a moment, and attends its own queries to them, with
the causal mask offset by where its queries sit. One all-gather each for K and V, not overlapped with
compute (Megatron-Core's ``cp_comm_type="all_gather"``). Only the KV heads travel, so grouped-query
attention (Llama 3: 8 KV heads for 64 or 128 query heads) keeps the gathered K/V small. Differentiable:
the backward of an all-gather is a reduce-scatter of the gradients, summing every rank's share of dK/dV
(``tensor_parallel.sequence_parallel.GatherFromSequence``, along the sequence dim 2).
"""

from __future__ import annotations

import torch

from shardlib.core.context_parallel.online_softmax import check_shards
from shardlib.core.model import attention
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.tensor_parallel.sequence_parallel import GatherFromSequence


def all_gather_kv_attention(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                            scale: float | None = None) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence: ``q (b, H, s/n, hd)``, ``k, v (b, KV, s/n,
    hd)`` (contiguous shards, rank order) in, ``(b, H, s/n, hd)`` out. The whole K/V lives on every rank
    for the length of this call."""
    check_shards(q.shape, k.shape, v.shape, ctx.world_size, local=True)
    group = TPGroup.world(ctx)
    k_all, v_all = (GatherFromSequence.apply(t, group, 2) for t in (k, v))  # (b, KV, s/n, hd) -> (b, KV, s, hd)
    part = q.shape[2]
    rows = torch.arange(part, device=q.device) + ctx.rank * part  # (s/n,): query i sits at rank * s/n + i
    return attention(q, k_all, v_all, rows, causal, scale)  # (b, H, s/n, hd)
