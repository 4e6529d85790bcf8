"""Rank functions of tensor and sequence parallelism: the blocks, the two cut orders of a pair, and a
block with sequence parallelism, each reporting what it computed and what it sent (from ``ctx.comm``)
and, for sequence parallelism, the activation bytes autograd saved (``lab.measure.SavedBytes``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shardlib.core.config import ModelConfig
from shardlib.core.tensor_parallel.blocks import ParallelAttention, ParallelBlock, ParallelMLP
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    shard_columns,
    shard_rows,
)
from shardlib.core.tensor_parallel.sequence_parallel import SEQ_DIM, SequenceParallelBlock, check_sequence_parallel
from shardlib.lab.measure import SavedBytes


def _weight_grads(module) -> dict[str, torch.Tensor]:
    """This rank's slices of the weight gradients, by weight name: rows of the column-parallel matrices
    (q, k, v, gate, up), columns of the row-parallel ones (o, down)."""
    return {name.rpartition(".")[2]: m.weight.grad for name, m in module.named_modules()
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear))}


@dataclass(frozen=True)
class TPBlockResult:
    """One rank's forward (and backward) of a tensor-parallel block: the whole output, the count and
    buffer bytes of its collectives in each pass and, after a backward, the gradient of ``x`` and this
    rank's slices of the weight gradients (by weight name)."""

    output: torch.Tensor  # (b, s, d_model), whole on every rank
    forward_collectives: int
    forward_bytes: int
    backward_collectives: int = 0
    backward_bytes: int = 0
    grad_x: torch.Tensor | None = None  # (b, s, d_model); None: forward only
    weight_grads: dict = field(default_factory=dict)


def _forward_backward(ctx, block, x: torch.Tensor, grad_output: torch.Tensor | None) -> TPBlockResult:
    """Forward (and backward when ``grad_output`` is given), counting the collectives of each pass."""
    x = x.to(ctx.device).clone().requires_grad_(grad_output is not None)
    out = block(x)
    n_forward = len(ctx.comm.records)
    forward = (out.detach(), n_forward, sum(r.size_bytes for r in ctx.comm.records))
    if grad_output is None:
        return TPBlockResult(*forward)
    out.backward(grad_output.to(ctx.device))
    backward = ctx.comm.records[n_forward:]
    return TPBlockResult(*forward, len(backward), sum(r.size_bytes for r in backward), x.grad, _weight_grads(block))


def tp_mlp_on_rank(ctx, x: torch.Tensor, w: dict, grad_output: torch.Tensor | None = None) -> TPBlockResult:
    """The gated MLP (``w``: ``gate``, ``up``, ``down``) split over every rank (``blocks.ParallelMLP``).

    Returns the output, the collective counts and bytes of each pass and, with ``grad_output``, the
    gradient of ``x`` and of this rank's weight slices (``weight_grads["gate"]`` is this rank's rows of
    the full gate gradient, ``weight_grads["down"]`` its columns of the full down gradient)."""
    return _forward_backward(ctx, ParallelMLP(w, TPGroup.world(ctx)).to(ctx.device), x, grad_output)


def tp_attention_on_rank(ctx, x: torch.Tensor, w: dict, model: ModelConfig,
                         grad_output: torch.Tensor | None = None) -> TPBlockResult:
    """Causal GQA of ``model``'s heads (``w``: ``q``, ``k``, ``v``, ``o``) split by whole heads over every
    rank (``blocks.ParallelAttention``): one all-reduce forward, one backward."""
    block = ParallelAttention(w, model, TPGroup.world(ctx)).to(ctx.device)
    return _forward_backward(ctx, block, x, grad_output)


@dataclass(frozen=True)
class PairResult:
    """One rank's pair: the whole output and its collectives from its comm log, ``(op, buffer bytes)``
    and ``(op, wire bytes)`` under the ring."""

    output: torch.Tensor  # (b, s, d_model)
    collectives: tuple[tuple[str, int], ...]
    wire: tuple[tuple[str, int], ...]


def pair_column_then_row_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                                 activation=F.gelu) -> PairResult:
    """The right cut: ``w1`` by columns, ``w2`` by rows. One all-reduce of the output."""
    tp, r = ctx.world_size, ctx.rank
    hidden = activation(F.linear(x, shard_columns(w1, tp)[r]))  # (b, s, d_ff / tp): no communication
    out = ctx.comm.all_reduce(F.linear(hidden, shard_rows(w2, tp)[r]))  # (b, s, d_model): sum of partials
    return _bill(ctx, out)


def pair_row_then_column_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor,
                                 activation=F.gelu) -> PairResult:
    """The other cut: ``w1`` by rows, ``w2`` by columns. The first product is partial, and the
    activation is not linear, so the partials must be summed *before* it (an all-reduce of the wide
    intermediate); the second product leaves each rank a slice of the output, gathered at the end."""
    tp, r = ctx.world_size, ctx.rank
    x_slice = x.chunk(tp, dim=-1)[r]  # (b, s, d_model / tp): this rank's input features
    hidden = ctx.comm.all_reduce(F.linear(x_slice, shard_rows(w1, tp)[r]))  # (b, s, d_ff): partial -> summed
    out_slice = F.linear(activation(hidden), shard_columns(w2, tp)[r])  # (b, s, d_model / tp)
    out = ctx.comm.all_gather(out_slice, dim=-1)  # (b, s, d_model)
    return _bill(ctx, out)


def _bill(ctx, out: torch.Tensor) -> PairResult:
    """``out`` with this rank's collectives, from its comm log."""
    records = ctx.comm.records
    return PairResult(out, tuple((c.op, c.size_bytes) for c in records), tuple((c.op, c.wire_bytes) for c in records))


@dataclass(frozen=True)
class SPBlockResult:
    """One rank's block, tensor parallel alone or sequence parallel (see ``sp_block_on_rank``)."""

    output: torch.Tensor  # (b, s / tp, d) sequence parallel, (b, s, d) tensor parallel alone
    activation_bytes: int  # what autograd saved in the forward
    forward: tuple[tuple[str, int, int], ...]  # (op, size_bytes, wire_bytes) of each collective
    backward: tuple[tuple[str, int, int], ...]
    grad_x: torch.Tensor | None = None  # the shape of ``output``; None: forward only
    weight_grads: dict = field(default_factory=dict)  # this rank's slices, by weight name


def sp_block_on_rank(ctx, x: torch.Tensor, w: dict, model: ModelConfig, grad_output: torch.Tensor | None = None,
                     sequence_parallel: bool = True) -> SPBlockResult:
    """One block of ``model`` (weights ``w``) on this rank, forward and (with ``grad_output``) backward:
    sequence parallel (``x`` cut by sequence, this rank's shard in and out) or tensor parallel alone
    (``x`` whole on every rank). ``x`` and ``grad_output`` are the whole ``(b, s, d)`` tensors.

    Returns ``output`` and ``grad_x`` (this rank's shard, or the whole tensor for tensor parallelism),
    ``weight_grads`` (this rank's slices), ``activation_bytes`` (what autograd saved in the forward),
    and ``forward`` / ``backward``: ``(op, size_bytes, wire_bytes)`` of each collective."""
    tp, r = ctx.world_size, ctx.rank
    check_sequence_parallel(model, x.shape[SEQ_DIM], tp)
    tpg = TPGroup.world(ctx)
    block = (SequenceParallelBlock if sequence_parallel else ParallelBlock)(w, model, tpg).to(ctx.device)
    cut = (lambda t: t.chunk(tp, dim=SEQ_DIM)[r]) if sequence_parallel else (lambda t: t)
    h = cut(x).to(ctx.device).clone().requires_grad_(grad_output is not None)
    params = {p.data_ptr() for p in block.parameters()}
    with SavedBytes(params) as saved:
        out = block(h)
    n_forward = len(ctx.comm.records)
    grads = {}
    if grad_output is not None:
        out.backward(cut(grad_output).to(ctx.device))
        grads = {"grad_x": h.grad, "weight_grads": _weight_grads(block)}
    records = tuple((c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records)
    return SPBlockResult(out.detach(), saved.size_bytes, records[:n_forward], records[n_forward:], **grads)
