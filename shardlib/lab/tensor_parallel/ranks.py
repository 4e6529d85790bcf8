"""Rank functions of tensor and sequence parallelism: a pair cut either way, and one block (the MLP,
attention, or the whole block, tensor parallel alone or sequence parallel) forward and backward, each
pass a span on the rank's timeline (``forward``, ``backward``), so its collectives can be told apart."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.tensor_parallel.blocks import ParallelAttention, ParallelBlock, ParallelMLP
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    shard_columns,
    shard_rows,
)
from shardlib.core.tensor_parallel.sequence_parallel import SEQ_DIM, check_sequence_parallel
from shardlib.lab.measure import SavedBytes
from shardlib.predict.tensor_parallel import CUTS

BLOCK_MODULES = {  # part -> its core module on one rank
    "mlp": lambda w, model, tpg: ParallelMLP(w, tpg),
    "attention": ParallelAttention,
    "tensor parallel": ParallelBlock,
    "sequence parallel": lambda w, model, tpg: ParallelBlock(w, model, tpg, sequence_parallel=True),
}


def tp_block_on_rank(ctx, part: str, x: torch.Tensor, w: dict, model=None,
                     grad_output: torch.Tensor | None = None) -> dict:
    """``part`` (a key of ``BLOCK_MODULES``) of one block of ``model`` with weights ``w``, split over every
    rank, forward and (with ``grad_output``) backward, on whole ``(b, s, d)`` tensors (sequence parallel:
    this rank's run of tokens). Returns ``output``, ``grad_x``, ``weight_grads`` (this rank's slices, by
    weight name) and ``activation_bytes`` (what autograd saved in the forward)."""
    tp, r = ctx.world_size, ctx.rank
    if part == "sequence parallel":
        check_sequence_parallel(model, x.shape[SEQ_DIM], tp)
    block = BLOCK_MODULES[part](w, model, TPGroup.world(ctx)).to(ctx.device)
    cut = (lambda t: t.chunk(tp, dim=SEQ_DIM)[r]) if part == "sequence parallel" else (lambda t: t)
    h = cut(x).to(ctx.device).clone().requires_grad_(grad_output is not None)  # (b, s or s / tp, d)
    with ctx.timeline.span("forward"), SavedBytes({p.data_ptr() for p in block.parameters()}) as saved:
        out = block(h)
    if grad_output is not None:
        with ctx.timeline.span("backward"):
            out.backward(cut(grad_output).to(ctx.device))
    grads = {name.rpartition(".")[2]: m.weight.grad for name, m in block.named_modules()
             if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and m.weight.grad is not None}
    return {"output": out.detach(), "grad_x": h.grad, "weight_grads": grads, "activation_bytes": saved.size_bytes}


def pair_column_then_row_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                                 activation=F.gelu) -> torch.Tensor:
    """The right cut: ``w1`` by columns, ``w2`` by rows. One all-reduce of the output."""
    tp, r = ctx.world_size, ctx.rank
    hidden = activation(F.linear(x, shard_columns(w1, tp)[r]))  # (b, s, d_ff / tp): no communication
    return ctx.comm.all_reduce(F.linear(hidden, shard_rows(w2, tp)[r]))  # (b, s, d_model): sum of partials


def pair_row_then_column_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                                 activation=F.gelu) -> torch.Tensor:
    """The other cut: ``w1`` by rows, ``w2`` by columns. The activation is not linear, so the partial first
    product is summed *before* it (an all-reduce of the wide intermediate); the output slices are gathered."""
    tp, r = ctx.world_size, ctx.rank
    x_slice = x.chunk(tp, dim=-1)[r]  # (b, s, d_model / tp): this rank's input features
    hidden = ctx.comm.all_reduce(F.linear(x_slice, shard_rows(w1, tp)[r]))  # (b, s, d_ff): partial -> summed
    out_slice = F.linear(activation(hidden), shard_columns(w2, tp)[r])  # (b, s, d_model / tp)
    return ctx.comm.all_gather(out_slice, dim=-1)  # (b, s, d_model)


PAIRS = {CUTS[0]: pair_column_then_row_on_rank, CUTS[1]: pair_row_then_column_on_rank}  # cut -> rank function
