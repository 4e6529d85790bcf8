"""The transformer's blocks split over a ``TPGroup`` (Megatron-LM, Shoeybi et al. 2019, section 3).

``ParallelMLP``: gate and up column-parallel behind one f, down row-parallel. ``ParallelAttention``:
split by whole heads, Q, K, V column-parallel, the output projection row-parallel; with
``copy_kv_heads``, each KV head copied onto ``tp / KV`` ranks when there are fewer KV heads than ranks
(serving: nothing to train, so nothing to keep in step). ``ExpertParallelMLP``: Mixtral's experts (Jiang et
al. 2024) in place of the MLP, spread whole over the group (expert parallelism: GShard, Lepikhin et al. 2020;
Switch, Fedus et al. 2022), each rank's share of the tokens sent to them by all-to-all. ``ParallelBlock``:
``model.block_reference`` with both, one all-reduce each forward, the norm weights whole on every rank; with
``sequence_parallel`` each all-reduce is ``sequence_parallel``'s all-gather before and reduce-scatter after.
Each part has ``local(x)``, this rank's share from an input already in place (no communication):
``core.model``'s own computation on this rank's slices. ``forward(x)``: f, ``local``, then g. The attention takes the
tokens' ``positions`` and an ``attend(q, k, v)`` (a paged KV cache stands in there when serving).
"""

from __future__ import annotations

import torch
from torch import nn

from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.experts.dispatch import (
    EXPERT_KEYS,
    SHARED_KEYS,
    LocalExperts,
    layer_experts,
    moe_layer,
    shared_experts,
)
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.model import attention_layer_reference, latent_attention, mlp_reference, norm
from shardlib.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    CopyToParallelRegion,
    ReduceFromParallelRegion,
    RowParallelLinear,
    TPGroup,
)
from shardlib.core.tensor_parallel.sequence_parallel import gather_seq, scatter_seq


class ParallelMLP(nn.Module):
    """Llama's gated MLP ``down(silu(gate(x)) * up(x))`` split ``tpg.tp`` ways."""

    def __init__(self, w: dict, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.gate = ColumnParallelLinear(w["gate"], None, tpg)  # (d_ff / tp, d_model)
        self.up = ColumnParallelLinear(w["up"], None, tpg)  # (d_ff / tp, d_model)
        self.down = RowParallelLinear(w["down"], None, tpg)  # (d_model, d_ff / tp)

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return mlp_reference(x, self.gate.weight, self.up.weight, self.down.weight)  # (..., d_model): my share

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # f, once for gate and up
        return ReduceFromParallelRegion.apply(self.local(x), self.tpg)  # g: summed over the group


def moe_on_tp_tokens(x: torch.Tensor, router: torch.Tensor, experts, cfg: MoEConfig, tpg: TPGroup, ctx=None,
                     group=None, place: int | None = None, bias: torch.Tensor | None = None,
                     shared: dict | None = None, own_tokens: bool = False) -> torch.Tensor:
    """The MoE layer's output on tokens ``x`` ``(T, d_model)`` whole on every rank of ``tpg`` (as the attention's
    all-reduce leaves them): this rank's ``1/tp`` of the rows through ``dispatch.moe_layer`` over ``group``, its
    ``experts`` at ``place`` (``ctx=None``: every expert here; ``bias``: the router's selection bias), plus the
    ``shared`` experts' (whole on every rank) on the same rows, then every rank's rows gathered whole again.
    ``own_tokens`` (attention data-parallel): ``x`` is this rank's alone, all of it routed, nothing gathered."""
    mine = x if own_tokens else x.tensor_split(tpg.tp)[tpg.index]  # (about T / tp, d_model): the first T % tp one more
    y = moe_layer(mine, router, experts, cfg, bias, ctx=ctx, group=group, place=place).output
    if shared:
        y = y + shared_experts(mine, shared)
    return y if own_tokens else tpg.all_gather_rows(y, x.shape[0])  # (T, d_model)


class ExpertParallelMLP(nn.Module):
    """A sparse MLP (Mixtral's, DeepSeek-V3's) on the ranks of ``tpg``: the router (and its selection bias, and
    any shared experts) whole on every rank, rank ``i`` the ``i``-th block of ``n_experts / tp`` whole experts
    (``ExpertPlacement``). Tokens whole in, whole out (``moe_on_tp_tokens`` over ``tpg``: the counts' all-to-all,
    the rows' there and back, one all-gather); dropless, and a token's result does not depend on its batch.
    ``own_tokens``: each rank's tokens are its own (attention data-parallel), routed with no split or gather."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup, own_tokens: bool = False) -> None:
        super().__init__()
        self.tpg, self.cfg, self.own_tokens = tpg, MoEConfig.from_model(model), own_tokens
        n = ExpertPlacement(model.n_experts, tpg.tp).per_rank  # refuses a tp that does not divide the experts
        self.register_buffer("router", w["router"])  # (n_experts, d_model), whole on every rank
        self.register_buffer("router_bias", w.get("router_bias"))  # (n_experts,) or None
        for key, t in zip(EXPERT_KEYS, layer_experts(w, slice(tpg.index * n, (tpg.index + 1) * n))):
            self.register_buffer(key, t.clone())  # (n, d_ff, d_model) or (n, d_model, d_ff): this rank's only
        self.shared = {k: w[k] for k in SHARED_KEYS if k in w}  # whole: each rank runs them on its own rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        experts, tpg = LocalExperts(*(getattr(self, k) for k in EXPERT_KEYS)), self.tpg
        rows = x.reshape(-1, x.shape[-1])  # (tokens, d_model)
        y = moe_on_tp_tokens(rows, self.router, experts, self.cfg, tpg, ctx=tpg if tpg.tp > 1 else None,
                             group=tpg.group, place=tpg.index, bias=self.router_bias, shared=self.shared,
                             own_tokens=self.own_tokens)  # the experts' ranks: the group
        return y.view(x.shape)


def copy_kv_heads(w: torch.Tensor, model: ModelConfig, tp: int) -> torch.Tensor:
    """k or v's ``(KV hd, d)`` weight, each KV head repeated ``tp / KV`` times when ``tp > KV``."""
    if tp <= model.n_kv_heads:
        return w
    copies = tp // model.n_kv_heads
    return w.view(model.n_kv_heads, model.head_dim, -1).repeat_interleave(copies, dim=0).flatten(0, 1)  # (tp hd, d)


class ParallelAttention(nn.Module):
    """Causal GQA split by whole heads: rank ``r`` holds ``H / tp`` query heads and the KV heads they read."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup, copy_kv: bool = False) -> None:
        super().__init__()
        check_heads(model, tpg.tp, copy_kv)
        self.tpg, self.model = tpg, model
        self.heads, self.kv_heads = model.n_heads // tpg.tp, max(1, model.n_kv_heads // tpg.tp)
        self.q = ColumnParallelLinear(w["q"], None, tpg)  # (H/tp * hd, d)
        self.k = ColumnParallelLinear(copy_kv_heads(w["k"], model, tpg.tp), None, tpg)  # (KV/tp * hd, d)
        self.v = ColumnParallelLinear(copy_kv_heads(w["v"], model, tpg.tp), None, tpg)  # (KV/tp * hd, d)
        self.o = RowParallelLinear(w["o"], None, tpg)  # (d, H/tp * hd)

    def local(self, x: torch.Tensor, positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
        """This rank's heads on ``x`` (..., seq, d), then its share of o: (..., seq, d), to be summed."""
        mine = {k: getattr(self, k).weight for k in ("q", "k", "v", "o")}
        return attention_layer_reference(x, mine, self.model, positions, attend)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # f, once for Q, K and V
        return ReduceFromParallelRegion.apply(self.local(x, positions, attend), self.tpg)  # g


class ParallelLatentAttention(nn.Module):
    """DeepSeek's multi-head latent attention split by whole heads: rank ``r`` holds ``H / tp`` heads' rows of
    ``q_b`` (or ``q``) and ``kv_b`` and their columns of ``o``. The latent has no heads: ``q_a``, ``kv_a`` and
    their norms are whole on every rank, so every rank computes, and caches, every token's whole latent
    (tensor parallelism copies the cache ``tp`` times). Served absorbed (``model.latent_attention``)."""

    kv_heads = 1  # the cache holds one entry a token, shared by every head

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup) -> None:
        super().__init__()
        if model.n_heads % tpg.tp:
            raise ValueError(f"{model.n_heads} query heads cannot be split {tpg.tp} ways: each device needs whole "
                             "heads")
        self.tpg, self.model, self.heads = tpg, model, model.n_heads // tpg.tp
        q = "q_b" if "q_b" in w else "q"
        self.split = nn.ModuleDict({q: ColumnParallelLinear(w[q], None, tpg),  # (H/tp * qk_dim, q_rank or d)
                                    "kv_b": ColumnParallelLinear(w["kv_b"], None, tpg),  # (H/tp (nope + v), kv_rank)
                                    "o": RowParallelLinear(w["o"], None, tpg)})  # (d, H/tp * v_dim)
        for k in ("q_a", "q_a_norm", "kv_a", "kv_a_norm"):  # whole on every rank
            self.register_buffer(k, w.get(k))

    def local(self, x: torch.Tensor, positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
        mine = {k: t for k in ("q_a", "q_a_norm", "kv_a", "kv_a_norm") if (t := getattr(self, k)) is not None}
        mine.update({k: layer.weight for k, layer in self.split.items()})
        return latent_attention(x, mine, self.model, positions, attend)  # (..., seq, d): my heads' share

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # f
        return ReduceFromParallelRegion.apply(self.local(x, positions, attend), self.tpg)  # g


class ParallelBlock(nn.Module):
    """``model.block_reference`` on one rank of ``tpg``: ``h + attn(norm h)``, then ``+ mlp(norm .)`` (the
    experts' with a router). With ``sequence_parallel`` it takes and returns this rank's run of the residual
    stream, (b, s/tp, d_model). ``experts``: the group the experts spread over when each rank's tokens are its
    own (attention data-parallel, ``tpg`` of one rank); default ``tpg``, its tokens split among its ranks."""

    def __init__(self, w: dict, model: ModelConfig, tpg: TPGroup, copy_kv: bool = False,
                 sequence_parallel: bool = False, experts: TPGroup | None = None) -> None:
        super().__init__()
        self.model, self.tpg, self.sequence_parallel = model, tpg, sequence_parallel
        self.attention = (ParallelLatentAttention(w, model, tpg) if "kv_a" in w else
                          ParallelAttention(w, model, tpg, copy_kv) if "q" in w else None)
        if "router" in w and sequence_parallel:
            raise ValueError("sequence parallelism is built for dense blocks; this block has experts")
        self.mlp = (ParallelMLP(w, tpg) if "gate" in w else
                    ExpertParallelMLP(w, model, experts or tpg, experts is not None) if "router" in w else None)
        self.register_buffer("attn_norm", w.get("attn_norm"))  # (d,), whole on every rank; None: no weight
        self.register_buffer("mlp_norm", w.get("mlp_norm"))

    def _pair(self, part: nn.Module, x: torch.Tensor, *args) -> torch.Tensor:
        """``part`` on ``x``: f, its share, g (one all-reduce); sequence parallel: all-gather my tokens'
        ``x``, the share, reduce-scatter it back to my tokens, (b, s/tp, d)."""
        if self.sequence_parallel:
            return scatter_seq(part.local(gather_seq(x, self.tpg), *args), self.tpg)
        return part(x, *args)

    def forward(self, h: torch.Tensor, positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
        if self.attention is not None:
            h = h + self._pair(self.attention, norm(h, self.attn_norm, self.model), positions, attend)
        if self.mlp is not None:
            h = h + self._pair(self.mlp, norm(h, self.mlp_norm, self.model))
        return h
