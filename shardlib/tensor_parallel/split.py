"""Tensor parallelism in one process: the column and row splits, and the pair that needs one sum.

A linear layer stores its weight as ``(out_features, in_features)`` (the ``nn.Linear`` convention) and
computes ``y = x @ W.T``. Two ways to cut it across ``n`` devices (Megatron-LM, Shoeybi et al. 2019,
section 3):

* **by columns of the output** (``shard_columns``: split ``W`` along dim 0). Every device needs the
  whole input and produces a slice of the output features. No communication.
* **by rows of the input** (``shard_rows``: split ``W`` along dim 1). Every device holds a slice of the
  input features and produces a *partial* output over all output features; the partials must be summed
  across devices: an all-reduce.

Chaining them column-then-row (``TensorParallelPair``) lets each device feed its slice of the
intermediate straight into its row slice of the second matrix, so one sum at the very end is the only
communication of the pair, and any elementwise activation in between needs none. The rank-by-rank
version, with real collectives, is in ``layers.py`` and ``blocks.py``.

Pure: torch tensors, one process, never ``torch.distributed``.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import choice, whole_number
from ..models import ModelConfig, usable_tensor_parallel_degrees
from ..runtime.records import wire_bytes


def _check_shards(n_shards) -> int:
    return whole_number(n_shards, "n_shards")


def _split(weight: torch.Tensor, n_shards: int, dim: int, what: str) -> list[torch.Tensor]:
    n_shards = _check_shards(n_shards)
    if weight.dim() != 2 and not (dim == 0 and weight.dim() == 1):
        raise ValueError(f"expected an (out, in) weight matrix, got shape {tuple(weight.shape)}")
    size = weight.shape[dim]
    if size % n_shards:
        raise ValueError(f"{size} {what} cannot be split {n_shards} ways: each shard needs an equal, whole "
                         f"number of them ({size} / {n_shards} = {size / n_shards:g})")
    return list(weight.chunk(n_shards, dim=dim))


def shard_columns(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """Split an ``(out, in)`` weight (or an ``(out,)`` bias) along its output dim into ``n_shards`` slices.

    For the first matrix of a pair (the QKV projections; the MLP's up and gate): each device computes
    ``out / n`` whole output features from the whole input, with no communication.
    """
    return _split(weight, n_shards, 0, "output features")


def shard_rows(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """Split an ``(out, in)`` weight along its input dim into ``n_shards`` slices.

    For the second matrix of a pair (the attention output projection; the MLP's down projection): each
    device holds ``in / n`` input features and computes a partial output over all ``out`` features.
    The partials must be summed across devices: that all-reduce is the communication of the pair.
    """
    return _split(weight, n_shards, 1, "input features")


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
        self.n_shards = _check_shards(n_shards)
        self.activation = activation
        self.first_weights = nn.ParameterList(nn.Parameter(w.detach().clone()) for w in shard_columns(first.weight, n_shards))
        self.first_biases = (None if first.bias is None else
                             nn.ParameterList(nn.Parameter(b.detach().clone()) for b in shard_columns(first.bias, n_shards)))
        self.second_weights = nn.ParameterList(nn.Parameter(w.detach().clone()) for w in shard_rows(second.weight, n_shards))
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


CUTS = ("column then row", "row then column")


def pair_collectives(cut: str, tp: int, tokens: int, d_model: int, d_hidden: int,
                      bytes_per_value: int = 4) -> list[tuple[str, int]]:
    """The forward collectives of one ``d_model -> d_hidden -> d_model`` pair split ``tp`` ways, as
    ``(op, size_bytes)`` in ``runtime.records``' counting, for ``tokens`` tokens (batch x sequence).

    Column then row: one all-reduce of the output. Row then column: an all-reduce of the wide
    intermediate before the activation, then an all-gather of the output slices. One rank: nothing.
    """
    choice(cut, CUTS, "cut")
    if whole_number(tp, "tp") == 1:
        return []
    if cut == CUTS[0]:
        return [("all_reduce", tokens * d_model * bytes_per_value)]
    return [("all_reduce", tokens * d_hidden * bytes_per_value), ("all_gather", tokens * d_model * bytes_per_value)]


def pair_wire_collectives(cut: str, tp: int, tokens: int, d_model: int, d_hidden: int,
                          bytes_per_value: int = 4) -> list[tuple[str, int]]:
    """``pair_collectives`` with each buffer turned into the bytes one rank puts on the wire under the
    ring (``runtime.records.wire_bytes``): ``2(tp-1)/tp`` of an all-reduce's buffer, ``(tp-1)/tp`` of an
    all-gather's."""
    return [(op, wire_bytes(op, size, tp))
            for op, size in pair_collectives(cut, tp, tokens, d_model, d_hidden, bytes_per_value)]


def other_cut_ratios(d_model: int, d_hidden: int) -> dict[str, float]:
    """Row-then-column's bill over column-then-row's, for one pair, at any ``tp > 1`` (the ``tp`` terms
    cancel), counted three ways:

    * ``collectives``: 2 against 1;
    * ``buffer``: ``(d_hidden + d_model) / d_model``: the wide intermediate's all-reduce plus the output's
      all-gather, against the output's all-reduce (buffers as nccl-tests' *size* counts them);
    * ``wire``: ``(2 d_hidden + d_model) / (2 d_model) = d_hidden / d_model + 1/2``: per rank under the
      ring, where an all-reduce sends ``2(tp-1)/tp`` of its buffer and an all-gather ``(tp-1)/tp``.

    "Doubles the communication" holds for the count of collectives, and so for the time of a pair whose
    collectives each cost one fixed start-up (latency-bound); in bytes it holds only when ``d_hidden``
    equals ``d_model`` (buffer), and never exactly on the wire (1.5 there)."""
    d_model, d_hidden = whole_number(d_model, "d_model"), whole_number(d_hidden, "d_hidden")
    return {"collectives": 2.0, "buffer": (d_hidden + d_model) / d_model, "wire": d_hidden / d_model + 0.5}


def max_tensor_parallel_shards(model: ModelConfig) -> int:
    """The largest tensor-parallel degree ``model``'s shapes allow: whole KV heads and query heads per
    device, and ``d_ff`` and the vocabulary divisible (see ``models.tensor_parallel_problems``)."""
    return max(usable_tensor_parallel_degrees(model))


