"""The toy transformer's blocks split over a ``TPGroup`` (Megatron-LM, Shoeybi et al. 2019, section 3).

``ParallelMLP``: gate and up column-parallel behind one f, down row-parallel. ``ParallelAttention``:
split by whole heads, Q, K, V column-parallel, the output projection row-parallel. ``ParallelBlock``:
``toy.block_reference`` with both, one all-reduce each forward. Each part has ``local(x)``, this rank's
share from an input already in place (no communication), and ``forward(x)``: f, ``local``, then g.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    CopyToParallelRegion,
    ReduceFromParallelRegion,
    RowParallelLinear,
    TPGroup,
)
from shardlib.core.toy import causal_gqa, rms_norm, split_heads


class ParallelMLP(nn.Module):
    """Llama's gated MLP ``down(silu(gate(x)) * up(x))`` split ``tpg.tp`` ways."""

    def __init__(self, w: dict, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.gate = ColumnParallelLinear(w["gate"], None, tpg)  # (d_ff / tp, d_model)
        self.up = ColumnParallelLinear(w["up"], None, tpg)  # (d_ff / tp, d_model)
        self.down = RowParallelLinear(w["down"], None, tpg)  # (d_model, d_ff / tp)

    def local(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate.local(x), self.up.local(x)  # each (b, s, d_ff / tp)
        return self.down.partial(F.silu(gate) * up)  # (b, s, d_model): this rank's share

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # f, once for gate and up
        return ReduceFromParallelRegion.apply(self.local(x), self.tpg)  # g: summed over the group


class ParallelAttention(nn.Module):
    """Causal GQA split by whole heads: rank ``r`` holds ``H / tp`` query heads and the KV heads they read."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        check_heads(model, tpg.tp)
        self.tpg = tpg
        self.heads, self.kv_heads = model.n_heads // tpg.tp, model.n_kv_heads // tpg.tp
        self.q = ColumnParallelLinear(w["q"], None, tpg)  # (H/tp * hd, d)
        self.k = ColumnParallelLinear(w["k"], None, tpg)  # (KV/tp * hd, d)
        self.v = ColumnParallelLinear(w["v"], None, tpg)  # (KV/tp * hd, d)
        self.o = RowParallelLinear(w["o"], None, tpg)  # (d, H/tp * hd)

    def local(self, x: torch.Tensor) -> torch.Tensor:
        q = split_heads(self.q.local(x), self.heads)  # (b, H/tp, s, hd)
        k, v = split_heads(self.k.local(x), self.kv_heads), split_heads(self.v.local(x), self.kv_heads)
        return self.o.partial(causal_gqa(q, k, v))  # local heads only, then this rank's share of o

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # f, once for Q, K and V
        return ReduceFromParallelRegion.apply(self.local(x), self.tpg)  # g


class ParallelBlock(nn.Module):
    """``toy.block_reference`` on one rank of ``tpg``: ``h + attn(norm h)``, then ``+ mlp(norm .)``."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        self.attention = ParallelAttention(w, model, tpg) if "q" in w else None
        self.mlp = ParallelMLP(w, tpg) if "gate" in w else None

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.attention is not None:
            h = h + self.attention(rms_norm(h))  # one all-reduce
        if self.mlp is not None:
            h = h + self.mlp(rms_norm(h))  # one all-reduce
        return h
