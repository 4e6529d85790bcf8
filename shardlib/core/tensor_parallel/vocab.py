"""The two ends of a language model split over the vocabulary (Megatron-LM, Shoeybi et al. 2019, section 3).

``VocabParallelEmbedding``: rank ``i`` keeps token rows ``[i V/tp, (i+1) V/tp)``, looks up the tokens it
owns and writes zeros for the others (``local``); Megatron's g sums the partials, exactly, one non-zero
per token (with sequence parallelism the caller reduce-scatters them instead).

``vocab_parallel_cross_entropy``: the loss from this rank's ``V/tp`` logits, never gathering all ``V``.
Forward: three all-reduces of one value per token (the row max; the sum of exponentials; the target's
logit, which only its owner has), then ``loss = log sum exp(z - m) - (z_t - m)``. Backward: ``softmax -
one_hot`` on this rank's slice, with no communication.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.checks import whole_number
from shardlib.core.tensor_parallel.layers import ReduceFromParallelRegion, TPGroup


def _owned(ids: torch.Tensor, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which ids this rank owns, and each one's row in its slice (row 0 for the others, masked later)."""
    mine = (ids >= start) & (ids < end)
    return mine, torch.where(mine, ids - start, 0)


class VocabParallelEmbedding(nn.Module):
    """Keeps this rank's run of the ``(vocab, d_model)`` embedding's rows; looks up the tokens it owns."""

    def __init__(self, weight: torch.Tensor, tpg: TPGroup) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"expected a (vocab, d_model) embedding, got shape {tuple(weight.shape)}")
        self.tpg, self.vocab = tpg, weight.shape[0]
        self.start, self.end = vocab_range(self.vocab, tpg.tp, tpg.index)
        self.weight = nn.Parameter(weight[self.start:self.end].detach().clone())  # (vocab / tp, d_model)

    def local(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(b, s)`` token ids -> ``(b, s, d_model)``: the rows this rank owns, zeros elsewhere."""
        check_targets(tokens, tuple(tokens.shape) + (self.vocab,), self.vocab, "input")
        mine, rows = _owned(tokens, self.start, self.end)
        return F.embedding(rows, self.weight).masked_fill(~mine.unsqueeze(-1), 0.0)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallelRegion.apply(self.local(tokens), self.tpg)  # (b, s, d): one row per token


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy from this rank's ``(..., V/tp)`` logits; three all-reduces forward, none back."""

    @staticmethod
    def forward(fctx, logits_shard, targets, tpg: TPGroup):
        vocab = logits_shard.shape[-1] * tpg.tp
        check_targets(targets, tuple(logits_shard.shape), vocab)  # before any communication
        start, end = vocab_range(vocab, tpg.tp, tpg.index)
        row_max = tpg.all_reduce(logits_shard.max(dim=-1).values, op="max")  # (...): the max over all V
        shifted = logits_shard - row_max.unsqueeze(-1)  # every exponential <= 1: no overflow
        exp = shifted.exp()
        sum_exp = tpg.all_reduce(exp.sum(dim=-1))  # (...): sum over all V of exp(z - m)
        mine, rows = _owned(targets, start, end)
        target_logit = shifted.gather(-1, rows.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        target_logit = tpg.all_reduce(target_logit)  # (...): z_t - m, from the one rank that owns t
        fctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), mine, rows)  # this slice's softmax
        return sum_exp.log() - target_logit

    @staticmethod
    def backward(fctx, grad_loss):
        softmax, mine, rows = fctx.saved_tensors
        grad = softmax.scatter_add(-1, rows.unsqueeze(-1), -mine.unsqueeze(-1).to(softmax.dtype))  # - one_hot
        return grad * grad_loss.unsqueeze(-1), None, None  # (..., V/tp): no communication


def vocab_parallel_cross_entropy(logits_shard: torch.Tensor, targets: torch.Tensor, tpg: TPGroup) -> torch.Tensor:
    """``(b, s)`` per-token loss from this rank's ``(b, s, V/tp)`` logits and the ``(b, s)`` global target ids;
    every rank of ``tpg`` gets the same loss. Differentiable in ``logits_shard``."""
    return VocabParallelCrossEntropy.apply(logits_shard, targets, tpg)


def check_vocab_split(vocab: int, tp: int) -> int:
    """``vocab / tp``, the token rows each rank keeps, or a ValueError if they are not equal and whole."""
    vocab, tp = whole_number(vocab, "vocab (tokens in the vocabulary)"), whole_number(tp, "tp")
    if vocab % tp:
        raise ValueError(f"a vocabulary of {vocab} tokens cannot be split {tp} ways: each rank keeps an equal, "
                         f"whole run of token rows ({vocab} / {tp} = {vocab / tp:g}); Megatron pads the vocabulary "
                         f"to a multiple of 128 x tp, see `predict.shapes.padded_vocab_size`")
    return vocab // tp


def vocab_range(vocab: int, tp: int, index: int) -> tuple[int, int]:
    """The token ids ``[start, end)`` whose rows (embedding, LM head, logits) rank ``index`` of ``tp`` keeps."""
    rows = check_vocab_split(vocab, tp)
    if not 0 <= index < tp:
        raise ValueError(f"index {index} is outside a tensor-parallel group of {tp} ranks")
    return index * rows, (index + 1) * rows


def check_targets(targets: torch.Tensor, logits_shape: tuple, vocab: int, what: str = "target") -> None:
    """One integer token id in ``[0, vocab)`` per row of logits (the embedding's input too: ``what="input"``)."""
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"{what} tokens must be integer token ids, got a {targets.dtype} tensor")
    if tuple(targets.shape) != tuple(logits_shape[:-1]):
        raise ValueError(f"the logits are {tuple(logits_shape)} but the targets {tuple(targets.shape)}: one target "
                         f"token id per row of logits, so the targets' shape is the logits' without the last "
                         f"(vocabulary) dim, {tuple(logits_shape[:-1])}")
    if targets.numel() and (int(targets.min()) < 0 or int(targets.max()) >= vocab):
        bad = targets[(targets < 0) | (targets >= vocab)]
        raise ValueError(f"{what} token ids must lie in [0, {vocab}) for a vocabulary of {vocab} tokens; got "
                         f"{bad.unique()[:5].tolist()} (no id is skipped here, as F.cross_entropy's "
                         f"ignore_index would be)")
