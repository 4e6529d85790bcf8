"""The toy transformer's blocks split across a ``TPGroup``: the MLP, attention, and the whole block.

* ``ParallelMLP``: Llama's gated MLP. Gate and up are column-parallel behind one f (Megatron-LM fuses
  them into one matrix; two products on the same input cost the same communication); the product is
  elementwise and local; down is row-parallel.
* ``ParallelAttention``: causal grouped-query attention split by **whole heads**. Rank ``r`` holds query
  heads ``r H/tp .. (r+1) H/tp`` and the KV heads they read (Q, K, V column-parallel), computes
  attention for those heads alone, and the output projection is row-parallel over the same heads.
* ``ParallelBlock``: ``toy.block_reference`` split: pre-norm, residual, two all-reduces forward.

Each has ``partial(x)``, this rank's share before the sum (``local(x)`` is the same without f, for an
input that is already in place), and ``forward(x)``, the sum through g. The
ranks call ``forward``; ``simulate_tp_stack`` calls ``partial`` for every rank in one process and adds
them up, so the single-process simulation and the ranks run the very same code. Every layer is built
from the full weights (``toy.layer_weights``) and keeps its slices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..models import ModelConfig, check_heads, check_tensor_parallel
from ..toy import causal_gqa, rms_norm, split_heads
from .layers import CopyToParallelRegion, ReduceFromParallelRegion, RowParallelLinear, TPGroup
from .split import shard_columns


class ParallelMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` split ``tpg.tp`` ways (see the module docstring)."""

    def __init__(self, w: dict, tpg: TPGroup) -> None:
        super().__init__()
        tp, i = tpg.tp, tpg.index
        self.tpg = tpg
        self.gate = nn.Parameter(shard_columns(w["gate"], tp)[i].clone())  # (d_ff / tp, d_model)
        self.up = nn.Parameter(shard_columns(w["up"], tp)[i].clone())  # (d_ff / tp, d_model)
        self.down = RowParallelLinear.from_full(w["down"], None, tpg)  # (d_model, d_ff / tp)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(CopyToParallelRegion.apply(x, self.tpg))  # f once for gate and up

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share from an input already in place (after f, or after sequence parallelism's
        all-gather): no communication."""
        gate, up = F.linear(x, self.gate), F.linear(x, self.up)  # each (b, s, d_ff / tp)
        return self.down.partial(F.silu(gate) * up)  # (b, s, d_model), this rank's share

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallelRegion.apply(self.partial(x), self.tpg)  # g: summed across the group

    def weight_grads(self) -> dict[str, torch.Tensor]:
        """This rank's slices of the full weights' gradients: rows of gate and up, columns of down."""
        return {"gate": self.gate.grad, "up": self.up.grad, "down": self.down.weight.grad}


class ParallelAttention(nn.Module):
    """Causal GQA split by whole heads (see the module docstring): one all-reduce forward, one backward."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        tp, i = tpg.tp, tpg.index
        check_heads(model, tp)
        self.tpg = tpg
        self.heads, self.kv_heads = model.n_heads // tp, model.n_kv_heads // tp
        self.q = nn.Parameter(shard_columns(w["q"], tp)[i].clone())  # (H/tp * hd, d)
        self.k = nn.Parameter(shard_columns(w["k"], tp)[i].clone())  # (KV/tp * hd, d)
        self.v = nn.Parameter(shard_columns(w["v"], tp)[i].clone())  # (KV/tp * hd, d)
        self.o = RowParallelLinear.from_full(w["o"], None, tpg)  # (d, H/tp * hd)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(CopyToParallelRegion.apply(x, self.tpg))  # f once for Q, K and V

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share from an input already in place: no communication."""
        q = split_heads(F.linear(x, self.q), self.heads)  # (b, H/tp, s, hd)
        k, v = split_heads(F.linear(x, self.k), self.kv_heads), split_heads(F.linear(x, self.v), self.kv_heads)
        return self.o.partial(causal_gqa(q, k, v))  # local heads only, then this rank's share of o

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ReduceFromParallelRegion.apply(self.partial(x), self.tpg)

    def weight_grads(self) -> dict[str, torch.Tensor]:
        """This rank's rows of the full q, k, v gradients and columns of o's."""
        return {"q": self.q.grad, "k": self.k.grad, "v": self.v.grad, "o": self.o.weight.grad}


class ParallelBlock(nn.Module):
    """``toy.block_reference`` on one rank of ``tpg``: ``h + attn(norm h)``, then ``+ mlp(norm .)``,
    each part ending in g's all-reduce (two per block forward when both parts are present)."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        self.attention = ParallelAttention(w, model, tpg) if "q" in w else None
        self.mlp = ParallelMLP(w, tpg) if "gate" in w else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.attention is not None:
            h = h + self.attention(rms_norm(h))
        if self.mlp is not None:
            h = h + self.mlp(rms_norm(h))
        return h


def simulate_tp_stack(x: torch.Tensor, layers: list[dict], model: ModelConfig, tp: int) -> torch.Tensor:
    """The tensor-parallel stack in one process: every rank's ``partial`` computed here and summed,
    part by part (a stand-in for the all-reduce). Equal to ``toy.stack_reference`` within float32
    rounding: the partials are added in another order than one matrix product adds them."""
    check_tensor_parallel(model, tp)
    blocks = [[ParallelBlock(w, model, TPGroup(tp, r)) for r in range(tp)] for w in layers]
    h = x
    with torch.no_grad():
        for shards in blocks:
            if shards[0].attention is not None:
                n = rms_norm(h)
                h = h + sum(b.attention.partial(n) for b in shards)
            if shards[0].mlp is not None:
                n = rms_norm(h)
                h = h + sum(b.mlp.partial(n) for b in shards)
    return h
