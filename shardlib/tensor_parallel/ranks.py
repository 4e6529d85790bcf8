"""Rank functions of tensor parallelism: the blocks and the two cut orders, over every rank of the pool.

Each takes the full weights, keeps its slices (``TPGroup.world(ctx)``: rank ``r`` of ``world_size``
holds slice ``r``) and reports what it computed and what it sent, read from ``ctx.comm``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models import ModelConfig
from .blocks import ParallelAttention, ParallelMLP
from .layers import TPGroup
from .split import shard_columns, shard_rows


def _forward_backward(ctx, block, x: torch.Tensor, grad_output: torch.Tensor | None) -> dict:
    """Forward (and backward when ``grad_output`` is given), counting the collectives of each pass."""
    x = x.to(ctx.device).clone().requires_grad_(grad_output is not None)
    out = block(x)
    n_forward = len(ctx.comm.records)
    result = {"output": out.detach(), "forward_collectives": n_forward,
              "forward_bytes": sum(r.size_bytes for r in ctx.comm.records)}
    if grad_output is not None:
        out.backward(grad_output.to(ctx.device))
        backward = ctx.comm.records[n_forward:]
        result.update(grad_x=x.grad, backward_collectives=len(backward),
                      backward_bytes=sum(r.size_bytes for r in backward), weight_grads=block.weight_grads())
    return result


def tp_mlp_on_rank(ctx, x: torch.Tensor, w: dict, grad_output: torch.Tensor | None = None) -> dict:
    """The gated MLP (``w``: ``gate``, ``up``, ``down``) split over every rank (``blocks.ParallelMLP``).

    Returns the output, the collective counts and bytes of each pass and, with ``grad_output``, the
    gradient of ``x`` and of this rank's weight slices (``weight_grads["gate"]`` is this rank's rows of
    the full gate gradient, ``weight_grads["down"]`` its columns of the full down gradient)."""
    return _forward_backward(ctx, ParallelMLP(w, TPGroup.world(ctx)).to(ctx.device), x, grad_output)


def tp_attention_on_rank(ctx, x: torch.Tensor, w: dict, model: ModelConfig,
                         grad_output: torch.Tensor | None = None) -> dict:
    """Causal GQA of ``model``'s heads (``w``: ``q``, ``k``, ``v``, ``o``) split by whole heads over every
    rank (``blocks.ParallelAttention``): one all-reduce forward, one backward."""
    return _forward_backward(ctx, ParallelAttention(w, model, TPGroup.world(ctx)).to(ctx.device), x, grad_output)


def pair_column_then_row_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, activation=F.gelu) -> dict:
    """The right cut: ``w1`` by columns, ``w2`` by rows. One all-reduce of the output."""
    tp, r = ctx.world_size, ctx.rank
    hidden = activation(F.linear(x, shard_columns(w1, tp)[r]))  # (b, s, d_ff / tp): no communication
    out = ctx.comm.all_reduce(F.linear(hidden, shard_rows(w2, tp)[r]))  # (b, s, d_model): sum of partials
    return {"output": out, **_bill(ctx)}


def pair_row_then_column_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, activation=F.gelu) -> dict:
    """The other cut: ``w1`` by rows, ``w2`` by columns. The first product is partial, and the
    activation is not linear, so the partials must be summed *before* it (an all-reduce of the wide
    intermediate); the second product leaves each rank a slice of the output, gathered at the end."""
    tp, r = ctx.world_size, ctx.rank
    x_slice = x.chunk(tp, dim=-1)[r]  # (b, s, d_model / tp): this rank's input features
    hidden = ctx.comm.all_reduce(F.linear(x_slice, shard_rows(w1, tp)[r]))  # (b, s, d_ff): partial -> summed
    out_slice = F.linear(activation(hidden), shard_columns(w2, tp)[r])  # (b, s, d_model / tp)
    out = ctx.comm.all_gather(out_slice, dim=-1)  # (b, s, d_model)
    return {"output": out, **_bill(ctx)}


def _bill(ctx) -> dict:
    """This rank's collectives, from its comm log: ``(op, buffer bytes)`` and ``(op, wire bytes)``."""
    records = ctx.comm.records
    return {"collectives": [(c.op, c.size_bytes) for c in records], "wire": [(c.op, c.wire_bytes) for c in records]}
