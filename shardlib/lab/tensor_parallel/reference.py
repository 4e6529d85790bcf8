"""Tensor parallelism in one process: the column and row splits, the pair, and the toy stack summed.

A weight is stored ``(out_features, in_features)``, as ``nn.Linear`` does. ``shard_columns`` cuts its
output features (dim 0), ``shard_rows`` its input features (dim 1) (Megatron-LM, Shoeybi et al. 2019,
section 3). ``TensorParallelPair`` chains them column then row and sums the shards' partial outputs;
``simulate_tp_stack`` does the same for the toy's attention and MLP; ``simulate_vocab_parallel_cross_entropy``
computes the loss from ``vocab / tp`` slices of the logits. Pure: never ``torch.distributed``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.model import attention_layer_reference, mlp_reference, rms_norm
from shardlib.core.tensor_parallel.layers import ROW_PARALLEL, shard_columns, shard_rows
from shardlib.core.tensor_parallel.vocab import check_targets, check_vocab_split, vocab_range
from shardlib.predict.shapes import check_tensor_parallel


def _parameters(tensors: list[torch.Tensor]) -> nn.ParameterList:
    return nn.ParameterList(nn.Parameter(t.detach().clone()) for t in tensors)


class TensorParallelPair(nn.Module):
    """``second(activation(first(x)))`` computed as ``n_shards`` independent column-then-row slices.

    Shard ``i`` holds column slice ``i`` of ``first`` (and of its bias) and row slice ``i`` of
    ``second``. It computes ``activation(x @ W1_i.T + b1_i) @ W2_i.T`` with nothing from any other
    shard. Only the final outputs are summed (the all-reduce on real devices); ``second``'s bias is
    added once, after the sum, or it would be counted ``n_shards`` times. ``activation`` must be
    elementwise: it then acts on each slice of the intermediate exactly as on the whole.
    """

    def __init__(self, first: nn.Linear, second: nn.Linear, n_shards: int,
                 activation: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        super().__init__()
        if first.out_features != second.in_features:
            raise ValueError(
                f"the pair does not chain: first produces {first.out_features} features but second expects "
                f"{second.in_features}"
            )
        self.n_shards = whole_number(n_shards, "n_shards")
        self.activation = activation
        self.first_weights = _parameters(shard_columns(first.weight, n_shards))
        self.first_biases = None if first.bias is None else _parameters(shard_columns(first.bias, n_shards))
        self.second_weights = _parameters(shard_rows(second.weight, n_shards))
        self.second_bias = None if second.bias is None else nn.Parameter(second.bias.detach().clone())

    def shard_output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        """What device ``i`` computes on its own: a partial output over all output features."""
        bias = None if self.first_biases is None else self.first_biases[i]
        hidden = F.linear(x, self.first_weights[i], bias)  # (..., d_hidden / n): a slice, no communication
        if self.activation is not None:
            hidden = self.activation(hidden)  # elementwise: acts on the slice as on the whole
        return F.linear(hidden, self.second_weights[i])  # (..., d_out): partial, to be summed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.stack([self.shard_output(x, i) for i in range(self.n_shards)]).sum(0)  # the all-reduce
        return total if self.second_bias is None else total + self.second_bias


def _slice(w: torch.Tensor, name: str, tp: int, r: int) -> torch.Tensor:
    """Rank ``r``'s slice of weight ``name``, as ``blocks`` keeps it: o and down by rows, the rest by columns."""
    return (shard_rows if name in ROW_PARALLEL else shard_columns)(w, tp)[r].clone()


def simulate_tp_stack(x: torch.Tensor, layers: list[dict], model: ModelConfig, tp: int) -> torch.Tensor:
    """The tensor-parallel stack in one process: each rank's share is the unsharded layer on its slices
    (its heads, its ``d_ff / tp`` features), and the shares are summed (a stand-in for the all-reduce).
    Equal to ``model.stack_reference`` within float32 rounding: the partials add in another order."""
    check_tensor_parallel(model, tp)
    h = x
    with torch.no_grad():
        for w in layers:
            shards = [{k: _slice(t, k, tp, r) for k, t in w.items()} for r in range(tp)]
            if "q" in w:
                n = rms_norm(h)
                h = h + sum(attention_layer_reference(n, s, model) for s in shards)
            if "gate" in w:
                n = rms_norm(h)
                h = h + sum(mlp_reference(n, s["gate"], s["up"], s["down"]) for s in shards)
    return h


def simulate_vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, tp: int) -> torch.Tensor:
    """Per-token cross-entropy from ``tp`` slices of the vocabulary, as the ranks compute it, in one process.

    ``logits (..., vocab)``, ``targets (...)`` token ids. Each slice gives its row max, its sum of
    exponentials and (only the slice that owns the target) the target's logit; three reductions over the
    slices (stand-ins for the three all-reduces) combine them: ``loss = log sum exp(z - m) - (z_t - m)``.
    Equal to ``F.cross_entropy(reduction="none")`` within float32 rounding: the exponentials add in
    another order."""
    rows = check_vocab_split(logits.shape[-1], tp)
    check_targets(targets, logits.shape, logits.shape[-1])
    slices = logits.detach().split(rows, dim=-1)
    row_max = torch.stack([z.max(dim=-1).values for z in slices]).amax(0)  # the all-reduce MAX
    shifted = [z - row_max.unsqueeze(-1) for z in slices]
    sum_exp = torch.stack([z.exp().sum(-1) for z in shifted]).sum(0)  # the first all-reduce SUM
    target_logit = torch.zeros_like(row_max)
    for i, z in enumerate(shifted):  # the second all-reduce SUM: the owner adds the logit, the others 0
        start, end = vocab_range(logits.shape[-1], tp, i)
        mine = (targets >= start) & (targets < end)
        local = torch.where(mine, targets - start, 0)
        target_logit = target_logit + z.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
    return sum_exp.log() - target_logit
