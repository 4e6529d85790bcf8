"""Context parallelism in one process: the whole-sequence attention every run is checked against, its
gradients, the q/k/v checks, shards cut and joined, the ring played out, and a tiny attention layer.

``simulate_ring_attention`` runs every rank's ring pass here with the code the ranks run
(``online_softmax.attend_block``). ``attention_layer`` (q/k/v and output projections around any
attention) is what notebook 10 trains by ``train_attention_layer``, here with whole-sequence attention
and through the ring on ranks. Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import flag
from shardlib.core.context_parallel.online_softmax import attend_block, attention_reference, check_qkv
from shardlib.core.context_parallel.placement import check_sequence, chunks_of_rank, chunks_per_rank


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


def ring_pass(rank: int, world_size: int, q_shard, kv_blocks, placement: str, causal: bool, scale=None):
    """Rank ``rank``'s whole ring pass in one process: ``kv_blocks[j]`` is rank ``j``'s ``(k, v)`` shard,
    met in ring order (its own first, then rank ``rank - 1``'s, ...). Returns the output shard and the
    blocks computed per step, ``[(source rank, visible, diagonal), ...]``."""
    q_ids = chunks_of_rank(rank, world_size, placement)
    q_chunks = q_shard.chunk(len(q_ids), dim=2)
    acc = [None] * len(q_ids)
    steps = []
    for step in range(world_size):
        src = (rank - step) % world_size
        k, v = kv_blocks[src]
        steps.append((src, *attend_block(acc, q_chunks, q_ids, k, v, chunks_of_rank(src, world_size, placement),
                                         causal, scale)))
    return torch.cat([a.out for a in acc], dim=2), steps


def simulate_ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, world_size: int, causal: bool = True,
                            placement: str = "contiguous", scale: float | None = None) -> torch.Tensor:
    """Ring attention over ``world_size`` simulated ranks, gathered back into sequence order: equal to
    ``attention_reference`` within float32 rounding (the blocks are summed in another order)."""
    check_qkv(q.shape, k.shape, v.shape)
    flag(causal, "causal")
    chunks_per_rank(placement)
    qs = shard_sequence(q, world_size, placement)
    kvs = list(zip(shard_sequence(k, world_size, placement), shard_sequence(v, world_size, placement)))
    outs = [ring_pass(r, world_size, qs[r], kvs, placement, causal, scale)[0] for r in range(world_size)]
    return gather_sequence(outs, placement)


def attention_grads_reference(q, k, v, d_out, causal: bool = True, scale: float | None = None):
    """``(dq, dk, dv)`` of ``attention_reference`` on the whole sequence for the upstream gradient ``d_out``."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    return torch.autograd.grad(attention_reference(q, k, v, causal, scale), (q, k, v), d_out)


def attention_layer_weights(d_model: int, heads: int, kv_heads: int, head_dim: int, seed: int = 0) -> dict:
    """Seeded weights of a tiny attention layer: ``q (d, H hd)``, ``k, v (d, KV hd)``, ``o (H hd, d)``."""
    g = torch.Generator().manual_seed(seed)
    shapes = {"q": (d_model, heads * head_dim), "k": (d_model, kv_heads * head_dim),
              "v": (d_model, kv_heads * head_dim), "o": (heads * head_dim, d_model)}
    return {name: torch.randn(shape, generator=g) / shape[0] ** 0.5 for name, shape in shapes.items()}


def attention_layer(x: torch.Tensor, w: dict, head_dim: int, attend) -> torch.Tensor:
    """``x (b, s, d)`` through the q/k/v projections, ``attend(q, k, v)`` (``q (b, H, s, hd)``, ``k, v
    (b, KV, s, hd)``: whole-sequence attention, or one rank's ring attention on its shard), and the
    output projection: ``(b, s, d)``."""
    b, s, _ = x.shape
    q, k, v = ((x @ w[name]).reshape(b, s, -1, head_dim).transpose(1, 2) for name in ("q", "k", "v"))
    return attend(q, k, v).transpose(1, 2).reshape(b, s, -1) @ w["o"]


def train_attention_layer(x, target, weights: dict, head_dim: int, attend, steps: int = 5, lr: float = 0.5,
                          count: int | None = None, all_reduce=None) -> tuple[list[float], dict]:
    """Plain SGD on ``attention_layer`` through ``attend``, the loss the squared error against ``target``
    summed over ``x``'s tokens over ``count`` (default: ``target``'s elements, the mean): the loss before each
    step and the final weights. On a rank holding a shard of the tokens, ``count`` is the whole batch's and
    ``all_reduce`` sums the loss and each gradient over the ranks."""
    total = all_reduce or (lambda t: t)
    count = target.numel() if count is None else count
    w = {name: t.detach().clone().to(x.device).requires_grad_() for name, t in weights.items()}
    losses = []
    for _ in range(steps):
        loss = ((attention_layer(x, w, head_dim, attend) - target) ** 2).sum() / count
        losses.append(float(total(loss.detach().clone())))
        grads = torch.autograd.grad(loss, list(w.values()))
        with torch.no_grad():
            for t, g in zip(w.values(), grads):
                t -= lr * total(g.contiguous())
    return losses, {name: t.detach() for name, t in w.items()}
