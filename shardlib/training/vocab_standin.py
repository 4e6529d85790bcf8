"""A stand-in for ``tensor_parallel.vocab`` until it lands: the same names, the same arithmetic.

``VocabParallelEmbedding(weight, tpg)`` keeps rows ``[i V/tp, (i+1) V/tp)`` of the embedding; ``local``
looks up this rank's rows (zeros for the others' tokens, no communication); ``forward`` sums the partial
lookups (Megatron's g). ``vocab_parallel_cross_entropy(logits_shard, targets, tpg)``: per-token loss from
this rank's ``V/tp`` logits without gathering them: three all-reduces forward (the max, the sum of
exponentials, the target's logit), none backward (Shoeybi et al. 2019, section 3).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..tensor_parallel.layers import ReduceFromParallelRegion, TPGroup


def vocab_range(vocab: int, tpg: TPGroup) -> tuple[int, int]:
    """``(start, stop)`` of this rank's vocabulary rows; a ValueError unless ``tp`` divides ``vocab``."""
    if vocab % tpg.tp:
        raise ValueError(f"a vocabulary of {vocab} tokens does not split evenly over tp = {tpg.tp} ranks")
    part = vocab // tpg.tp
    return tpg.index * part, (tpg.index + 1) * part


class VocabParallelEmbedding(nn.Module):
    """The embedding split by vocabulary rows over ``tpg``."""

    def __init__(self, weight: torch.Tensor, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.start, self.stop = vocab_range(weight.shape[0], tpg)
        self.weight = nn.Parameter(weight[self.start:self.stop].detach().clone())  # (V/tp, d)

    def local(self, tokens: torch.Tensor) -> torch.Tensor:
        mine = (tokens >= self.start) & (tokens < self.stop)
        rows = F.embedding((tokens - self.start) * mine, self.weight)  # (b, s, d)
        return rows * mine.unsqueeze(-1)  # the others' tokens: zeros

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallelRegion.apply(self.local(tokens), self.tpg)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(fctx, logits, targets, tpg: TPGroup):
        start, stop = vocab_range(logits.shape[-1] * tpg.tp, tpg)
        top = logits.max(-1).values  # (b, s): the largest logit of every shard
        if tpg.tp > 1:
            top = tpg.comm.all_reduce(top.contiguous(), op="max", group=tpg.group)
        shifted = logits - top.unsqueeze(-1)
        exp = shifted.exp()  # (b, s, V/tp)
        total = tpg.all_reduce(exp.sum(-1))  # (b, s): the softmax's denominator, every shard's share
        mine = (targets >= start) & (targets < stop)
        idx = ((targets - start) * mine).unsqueeze(-1)
        target_logit = tpg.all_reduce(shifted.gather(-1, idx).squeeze(-1) * mine)  # (b, s)
        fctx.save_for_backward(exp / total.unsqueeze(-1), idx, mine)
        return total.log() - target_logit

    @staticmethod
    def backward(fctx, grad):  # d loss / d logit = softmax - one_hot(target): no communication
        softmax, idx, mine = fctx.saved_tensors
        g = softmax.clone()
        g.scatter_add_(-1, idx, -mine.unsqueeze(-1).to(g.dtype))
        return g * grad.unsqueeze(-1), None, None


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, targets: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    """Per-token loss ``(b, s)`` from this rank's logits ``(b, s, V/tp)``; ``targets`` are global ids."""
    return _VocabParallelCrossEntropy.apply(logits_shard, targets, tpg)
