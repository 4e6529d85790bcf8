"""Megatron's sequence parallelism on a rank (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2).

Outside each tensor-parallel pair, rank ``r`` keeps only its run of tokens of the residual stream, so
the norms and residual adds are stored once, not ``tp`` times. The pair's one all-reduce becomes its two
halves: ``GatherFromSequence`` (all-gather forward, reduce-scatter backward) before the pair, and
``ScatterToSequence`` (reduce-scatter forward, all-gather backward) after it
(``blocks.ParallelBlock(..., sequence_parallel=True)`` wraps each pair's ``local`` in them).
"""

from __future__ import annotations

import torch

from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.tensor_parallel.layers import TPGroup

SEQ_DIM = 1  # activations are (batch, seq, d_model)


class GatherFromSequence(torch.autograd.Function):
    """Before a pair: all-gather the sequence shards along ``dim`` forward; reduce-scatter the gradient
    backward (each rank keeps the sum over ranks of its own tokens' gradient)."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup, dim: int):
        fctx.tpg, fctx.dim = tpg, dim
        return tpg.all_gather(x, dim)  # (b, s/tp, d) -> (b, s, d)

    @staticmethod
    def backward(fctx, grad):
        return fctx.tpg.reduce_scatter(grad, fctx.dim), None, None  # (b, s, d) -> (b, s/tp, d), summed


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
    return x if tpg.tp == 1 else GatherFromSequence.apply(x, tpg, SEQ_DIM)


def scatter_seq(x, tpg: TPGroup):  # (b, s, d) partial -> (b, s/tp, d) summed; nothing to sum at tp = 1
    return x if tpg.tp == 1 else ScatterToSequence.apply(x, tpg)


def check_sequence_parallel(model: ModelConfig, seq: int, tp: int) -> None:
    """The heads split ``tp`` ways (the pair's rule) and the sequence ``tp`` ways (the shards' rule)."""
    check_heads(model, tp)
    if seq % tp:
        raise ValueError(f"sequence parallelism gives each of the {tp} ranks an equal run of tokens, but a "
                         f"sequence of {seq} tokens does not split {tp} ways "
                         f"({seq} = {tp} x {seq // tp} + {seq % tp})")
