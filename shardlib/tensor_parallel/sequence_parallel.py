"""Megatron sequence parallelism on a rank: the regions outside the tensor-parallel pair on sequence shards.

Tensor parallelism splits the matrices, but everything between two pairs (the norms, the residual
adds, dropout in a real model) runs on the whole ``(batch, seq, d_model)`` activation, replicated on
every rank: the same work and the same memory ``tp`` times over. Sequence parallelism (Korthikanti et
al. 2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.2.2) gives those
regions to the ranks by *sequence*: rank ``r`` keeps tokens ``r s/tp .. (r+1) s/tp`` of the residual
stream. Around each pair the one all-reduce becomes two halves of itself:

* before the pair, ``g`` (``GatherFromSequence``): all-gather the normed shards into the whole
  sequence the column-parallel matrices need (backward: reduce-scatter of the gradient);
* after the pair, ``g-bar`` (``ScatterToSequence``): reduce-scatter the partial outputs, each rank
  keeping the sum for its own tokens only (backward: all-gather).

A ring all-reduce *is* a reduce-scatter followed by an all-gather, so the wire bytes equal tensor
parallelism's exactly (``2 (tp-1)/tp`` of the activation per pair per pass); what changes is that
the norms and the residual stream are stored once, not ``tp`` times. The pairs themselves are
``tensor_parallel.blocks``' layers, called through ``local`` (their computation without ``f``).
This version keeps the gathered input of each pair for its backward; Megatron-LM can keep only the
shard and gather it again in the backward, trading an all-gather for more memory saved.

Autograd's saved tensors are counted with the pipeline's counter (``runtime.measure.SavedBytes``):
activation memory measured, not estimated.
"""

from __future__ import annotations

import torch
from torch import nn

from ..models import ModelConfig, check_heads
from ..runtime.measure import SavedBytes
from ..toy import rms_norm
from .blocks import ParallelAttention, ParallelBlock, ParallelMLP
from .layers import TPGroup

SEQ_DIM = 1  # activations are (batch, seq, d_model)


def _along_sequence(op: str, t: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    """``all_gather`` or ``reduce_scatter`` of ``t`` along the sequence dim, over the group's ranks."""
    collective = tpg.comm.all_gather if op == "all_gather" else tpg.comm.reduce_scatter
    return collective(t.contiguous(), dim=SEQ_DIM, group=tpg.group)


def _conjugate(name: str, forward_op: str, backward_op: str, doc: str) -> type:
    """An autograd function that runs ``forward_op`` forward and its conjugate ``backward_op`` on the
    gradient: the transpose of an all-gather is a reduce-scatter, and the other way round."""

    def forward(fctx, x, tpg: TPGroup):
        fctx.tpg = tpg
        return _along_sequence(forward_op, x, tpg)

    def backward(fctx, grad):
        return _along_sequence(backward_op, grad, fctx.tpg), None

    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                   "backward": staticmethod(backward), "__doc__": doc})


GatherFromSequence = _conjugate("GatherFromSequence", "all_gather", "reduce_scatter",
                                "Forward: all-gather the sequence shards (b, s/tp, d) into (b, s, d). Backward: "
                                "reduce-scatter of the gradient.")
ScatterToSequence = _conjugate("ScatterToSequence", "reduce_scatter", "all_gather",
                               "Forward: reduce-scatter the partial sums (b, s, d) to this rank's tokens (b, s/tp, d), "
                               "summed. Backward: all-gather of the shard's gradient.")


class SequenceParallelBlock(nn.Module):
    """``toy.block_reference`` with tensor parallelism inside each pair and sequence parallelism
    outside: takes and returns this rank's shard of the residual stream, (b, s/tp, d_model)."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.attention = ParallelAttention(w, model, tpg) if "q" in w else None
        self.mlp = ParallelMLP(w, tpg) if "gate" in w else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for part in (self.attention, self.mlp):
            if part is not None:
                whole = GatherFromSequence.apply(rms_norm(h), self.tpg)  # (b, s, d): norm on the shard, then gather
                h = h + ScatterToSequence.apply(part.local(whole), self.tpg)  # (b, s/tp, d): my tokens, summed
        return h


def weight_grads(block) -> dict[str, torch.Tensor]:
    """This rank's slices of the weight gradients of a block (``ParallelBlock`` or the one above)."""
    return {name: grad for part in (block.attention, block.mlp) if part is not None
            for name, grad in part.weight_grads().items()}


def check_sequence_parallel(model: ModelConfig, seq: int, tp: int) -> None:
    """The heads split ``tp`` ways (the pair's rule) and the sequence ``tp`` ways (the shards' rule)."""
    check_heads(model, tp)
    if seq % tp:
        raise ValueError(f"sequence parallelism gives each of the {tp} ranks an equal run of tokens, but a "
                         f"sequence of {seq} tokens does not split {tp} ways ({seq} = {tp} x {seq // tp} + {seq % tp})")


def sp_block_on_rank(ctx, x: torch.Tensor, w: dict, model: ModelConfig, grad_output: torch.Tensor | None = None,
                     sequence_parallel: bool = True) -> dict:
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
    result = {"output": out.detach(), "activation_bytes": saved.size_bytes, "grad_x": None, "weight_grads": {}}
    if grad_output is not None:
        out.backward(cut(grad_output).to(ctx.device))
        result.update(grad_x=h.grad, weight_grads=weight_grads(block))
    records = [(c.op, c.size_bytes, c.wire_bytes) for c in ctx.comm.records]
    result.update(forward=records[:n_forward], backward=records[n_forward:])
    return result
