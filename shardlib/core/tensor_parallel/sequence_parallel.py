"""Megatron's sequence parallelism on a rank (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2).

Outside each tensor-parallel pair, rank ``r`` keeps only its run of tokens of the residual stream, so
the norms and residual adds are stored once, not ``tp`` times. The pair's one all-reduce becomes its two
halves: ``GatherFromSequence`` (all-gather forward, reduce-scatter backward) before the pair, and
``ScatterToSequence`` (reduce-scatter forward, all-gather backward) after it. The pairs are
``blocks``' layers, called through ``local`` (their computation without f).
"""

from __future__ import annotations

import torch
from torch import nn

from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.model import rms_norm
from shardlib.core.tensor_parallel.blocks import ParallelAttention, ParallelMLP
from shardlib.core.tensor_parallel.layers import TPGroup

SEQ_DIM = 1  # activations are (batch, seq, d_model)


class GatherFromSequence(torch.autograd.Function):
    """Before a pair: all-gather the sequence shards forward; reduce-scatter the gradient backward."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        fctx.tpg = tpg
        return tpg.all_gather(x, SEQ_DIM)  # (b, s/tp, d) -> (b, s, d)

    @staticmethod
    def backward(fctx, grad):
        return fctx.tpg.reduce_scatter(grad, SEQ_DIM), None  # (b, s, d) -> (b, s/tp, d), summed


class ScatterToSequence(torch.autograd.Function):
    """After a pair: reduce-scatter the partial outputs forward; all-gather the gradient backward."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        fctx.tpg = tpg
        return tpg.reduce_scatter(x, SEQ_DIM)  # (b, s, d) partial -> (b, s/tp, d): my tokens, summed

    @staticmethod
    def backward(fctx, grad):
        return fctx.tpg.all_gather(grad, SEQ_DIM), None  # (b, s/tp, d) -> (b, s, d)


def gather_seq(x, tpg: TPGroup):  # (b, s/tp, d) -> (b, s, d); nothing to gather at tp = 1
    return x if tpg.tp == 1 else GatherFromSequence.apply(x, tpg)


def scatter_seq(x, tpg: TPGroup):  # (b, s, d) partial -> (b, s/tp, d) summed; nothing to sum at tp = 1
    return x if tpg.tp == 1 else ScatterToSequence.apply(x, tpg)


class SequenceParallelBlock(nn.Module):
    """``model.block_reference`` with tensor parallelism inside each pair and sequence parallelism
    outside: takes and returns this rank's shard of the residual stream, (b, s/tp, d_model)."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.attention = ParallelAttention(w, model, tpg) if "q" in w else None
        self.mlp = ParallelMLP(w, tpg) if "gate" in w else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        for part in (self.attention, self.mlp):
            if part is not None:
                whole = GatherFromSequence.apply(rms_norm(h), self.tpg)  # (b, s, d): norm my tokens, gather
                h = h + ScatterToSequence.apply(part.local(whole), self.tpg)  # (b, s/tp, d): my tokens
        return h


def check_sequence_parallel(model: ModelConfig, seq: int, tp: int) -> None:
    """The heads split ``tp`` ways (the pair's rule) and the sequence ``tp`` ways (the shards' rule)."""
    check_heads(model, tp)
    if seq % tp:
        raise ValueError(f"sequence parallelism gives each of the {tp} ranks an equal run of tokens, but a "
                         f"sequence of {seq} tokens does not split {tp} ways "
                         f"({seq} = {tp} x {seq // tp} + {seq % tp})")
