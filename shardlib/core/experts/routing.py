"""The mixture-of-experts router: the layer's one configuration, the gate functions, the top-k choice.

A router is a ``(n_experts, d_model)`` matrix that scores every expert for every token; each token goes
to its ``k`` best experts, weighted by gates (Shazeer et al. 2017, arXiv:1701.06538; GShard, Lepikhin et
al. 2020). One registry of gate functions, ``GATES``: ``"softmax-topk"`` (Mixtral, Jiang et al. 2024: a
softmax over the k chosen logits); ``"softmax-then-topk"`` (Switch Transformer, Fedus et al. 2021;
DeepSeek-V2: the k largest of a softmax over every expert); ``"softmax-then-topk-normalised"`` (GShard's top-2,
which renormalises its two gates, and Mixtral as ``transformers`` computes it: a softmax over every expert in
float32, the k largest, normalised to sum to 1); ``"sigmoid-topk"`` (DeepSeek-V3, 2024, arXiv:2412.19437, eqs.
13-15: sigmoid affinities, the chosen ones normalised to sum to 1). A selection bias (DeepSeek-V3's
auxiliary-loss-free balancing) chooses but never weighs; node-limited routing (DeepSeek-V3, section 2.1.2)
keeps a token on its ``M`` best nodes, each scored by the sum of its ``k // M`` best scores. ``skew`` tilts
every token towards one expert (notebook 04's knob). The gradient flows through the gates only. Multiplies
run on fixed blocks of rows (``blocked_rows``): a token's result never depends on who shared the call. No
``torch.distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

import torch
import torch.nn.functional as F

from shardlib.core.checks import (
    choice,
    flag,
    number_at_least,
    number_between,
    positive_number,
    same_dtype,
    whole_number,
    whole_number_between,
)
from shardlib.core.config import ModelConfig
from shardlib.core.experts.placement import ExpertPlacement

BLOCK_ROWS = 64  # rows per matrix-multiply call (see ``blocked_rows``)
MAX_PREFERENCE_BIAS = 1e4  # the hot expert's logit bonus at skew = 1
REROUTE_GATES = ("keep", "rescore")  # what a rerouted slot weighs (see ``balance.served_gates``)
BALANCING = ("none", "aux-loss", "aux-free")


# -- the gate functions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateSpec:
    """One gate function: ``affinity`` turns ``(T, E)`` logits into the scores the top-k ranks; ``gates``
    turns the chosen ``(T, k)`` affinities (and all logits) into weights; ``balance_probs`` is Switch's
    ``P_i`` per token ``(T, E)``. The papers: the module docstring."""

    affinity: Callable[[torch.Tensor], torch.Tensor]
    gates: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (chosen affinities, logits) -> (T, k)
    balance_probs: Callable[[torch.Tensor], torch.Tensor]


def _softmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.softmax(logits, dim=-1)


def _normalised(chosen: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return chosen / chosen.sum(dim=-1, keepdim=True)  # (T, k), summing to 1


GATES: dict[str, GateSpec] = {
    "softmax-topk": GateSpec(lambda logits: logits, lambda chosen, logits: _softmax(chosen), _softmax),
    "softmax-then-topk": GateSpec(_softmax, lambda chosen, logits: chosen, _softmax),
    "softmax-then-topk-normalised": GateSpec(lambda logits: _softmax(logits.float()), _normalised, _softmax),
    "sigmoid-topk": GateSpec(torch.sigmoid, _normalised,
                             lambda logits: torch.sigmoid(logits) / torch.sigmoid(logits).sum(dim=-1, keepdim=True)),
}


# -- configuration -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoEConfig:
    """Shapes and policies of one MoE layer: ``n_experts`` gated-MLP experts of ``d_model`` x ``d_ff``, ``k``
    per token, gates from ``gate`` (one of ``GATES``). ``skew`` in ``[0, 1]`` tilts every token towards
    ``hot_expert``. ``capacity_factor`` (``None``: dropless), ``reroute``, ``reroute_gate``: the capacity
    cap's policy (``balance``). ``balance``: ``"aux-loss"`` adds Switch's loss times ``aux_loss_coef``
    (Switch: 1e-2); ``"aux-free"`` moves a selection bias by ``bias_rate`` per step (DeepSeek-V3: 1e-3; a
    toy trained a few steps needs more). ``n_nodes``, ``max_nodes``: a token reaches at most ``max_nodes``
    of the nodes holding the experts in contiguous blocks (DeepSeek-V3: 4 of 8; ``None``: no limit)."""

    n_experts: int = 8
    k: int = 2
    d_model: int = 64
    d_ff: int = 128
    gate: str = "softmax-topk"
    skew: float = 0.0
    hot_expert: int = 0
    capacity_factor: float | None = None  # None: no cap, nothing is dropped
    reroute: bool = False
    reroute_gate: str = "keep"  # a rerouted slot's gate: "keep" the first choice's, or "rescore"
    balance: str = "none"
    aux_loss_coef: float = 0.01
    bias_rate: float = 0.01
    n_nodes: int = 1
    max_nodes: int | None = None
    gate_scale: float = 1.0  # the gates times this (DeepSeek-V3's routed scaling factor, 2.5)
    router_float32: bool = False  # scores from tokens and router cast to float32 (DeepSeek-V3 in transformers)

    def __post_init__(self) -> None:
        for name in ("n_experts", "d_model", "d_ff"):
            whole_number(getattr(self, name), name)
        whole_number_between(self.k, "k (experts per token)", 1, self.n_experts)
        choice(self.gate, tuple(GATES), "gate (the router's gate function)")
        number_between(self.skew, "skew (0: uniform preferences, 1: one hot expert)", 0.0, 1.0)
        whole_number_between(self.hot_expert, "hot_expert", 0, self.n_experts - 1)
        flag(self.reroute, "reroute")
        choice(self.reroute_gate, REROUTE_GATES, "reroute_gate (what a rerouted slot weighs)")
        if self.capacity_factor is not None:
            positive_number(self.capacity_factor, "capacity_factor (1.0 gives each expert exactly its even share "
                                                  "of token-slots; None for no cap)")
        if self.reroute and self.capacity_factor is None:
            raise ValueError("reroute=True moves token-slots that overflow an expert's capacity, but "
                             "capacity_factor is None (no capacity): set a capacity_factor too")
        choice(self.balance, BALANCING, "balance (how the load is balanced)")
        number_at_least(self.aux_loss_coef, "aux_loss_coef (Switch's alpha)")
        positive_number(self.bias_rate, "bias_rate (DeepSeek-V3's gamma, the bias step per training step)")
        whole_number(self.n_nodes, "n_nodes (the nodes the experts are spread over)")
        if self.n_experts % self.n_nodes:
            raise ValueError(f"{self.n_experts} experts cannot be spread evenly over {self.n_nodes} nodes: n_nodes "
                             f"must divide n_experts")
        positive_number(self.gate_scale, "gate_scale (the gates' multiplier)")
        flag(self.router_float32, "router_float32")
        if self.max_nodes is not None:
            whole_number_between(self.max_nodes, "max_nodes (M, the nodes one token may reach)", 1, self.n_nodes)
            reachable = self.max_nodes * (self.n_experts // self.n_nodes)
            if self.k > reachable:
                raise ValueError(f"a token limited to {self.max_nodes} node(s) of {self.n_experts // self.n_nodes} "
                                 f"experts each can reach only {reachable} experts, fewer than k = {self.k}: raise "
                                 f"max_nodes or lower k")

    @classmethod
    def from_model(cls, model: ModelConfig, **overrides) -> "MoEConfig":
        """The layer shape of ``model`` (``n_experts``, ``experts_per_token``, ``d_model``, a routed expert's
        width) and its router: the gate function, its scale and dtype, its groups (``expert_groups`` as nodes,
        a token on ``node_limit`` of them)."""
        if not model.is_moe:
            raise ValueError(f"{model.name} is a dense model (n_experts = {model.n_experts}): no experts to route to")
        grouped = model.expert_groups > 1
        base = dict(n_experts=model.n_experts, k=model.experts_per_token, d_model=model.d_model,
                    d_ff=model.expert_width, gate=model.router_gate, gate_scale=model.routed_scale,
                    router_float32=model.router_float32, n_nodes=model.expert_groups,
                    max_nodes=model.node_limit if grouped else None)
        return cls(**{**base, **overrides})

    def experts_per_rank(self, ep: int) -> int:
        """Whole experts each of ``ep`` ranks holds (``ExpertPlacement`` refuses an ``ep`` not dividing them)."""
        return ExpertPlacement(self.n_experts, ep).per_rank

    def but(self, **changes) -> "MoEConfig":
        """A copy with some fields changed (checked again)."""
        return replace(self, **changes)


def preference_bias(cfg: MoEConfig) -> torch.Tensor:
    """The ``(n_experts,)`` logit bonus the skew knob adds at ``cfg.hot_expert``: ``b = log((n - 1) p / (1 - p))``
    gives an indifferent token (all logits equal) the probability ``p = 1/n + skew (1 - 1/n)`` for it. Skew 1
    adds ``MAX_PREFERENCE_BIAS``, beyond any gap between unit-scale logits: every token ranks it first."""
    bias = torch.zeros(cfg.n_experts)
    if cfg.skew >= 1.0:
        bias[cfg.hot_expert] = MAX_PREFERENCE_BIAS
    elif cfg.skew > 0.0:
        n = cfg.n_experts
        p = 1.0 / n + cfg.skew * (1.0 - 1.0 / n)  # the hot expert's probability for an indifferent token
        bias[cfg.hot_expert] = math.log((n - 1) * p / (1.0 - p))
    return bias


# -- batch-invariant multiplies ------------------------------------------------------------------------
def blocked_rows(fn, rows: torch.Tensor, out_features: int) -> torch.Tensor:
    """``fn`` on ``rows`` in zero-padded blocks of ``BLOCK_ROWS``, so a row's result does not depend on how
    many rows came with it (BLAS picks kernels by batch size): the layer on ranks equals one process's."""
    n = rows.shape[0]
    if n == 0:
        return rows.new_zeros(0, out_features)
    pad = (-n) % BLOCK_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return torch.cat([fn(rows[i:i + BLOCK_ROWS]) for i in range(0, rows.shape[0], BLOCK_ROWS)])[:n]


# -- node-limited routing -----------------------------------------------------------------------------------
def limit_to_nodes(scores: torch.Tensor, k: int, n_nodes: int, max_nodes: int) -> torch.Tensor:
    """``scores`` ``(T, E)`` with every expert outside each token's ``max_nodes`` best nodes set to
    ``-inf``, so a top-k over the result picks only from those nodes (ties: the lower node first). A node
    scores the sum of its ``k // max_nodes`` (at least 1) highest scores."""
    grouped = scores.view(scores.shape[0], n_nodes, scores.shape[1] // n_nodes)  # (T, N, E / N); T may be 0
    ranked = grouped.topk(min(max(1, k // max_nodes), grouped.shape[2]), dim=-1).values.sum(dim=-1)  # (T, N)
    chosen = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[:, :max_nodes]  # (T, M)
    allowed = torch.zeros_like(ranked, dtype=torch.bool).scatter_(1, chosen, True)  # (T, N)
    allowed = allowed.repeat_interleave(scores.shape[1] // n_nodes, dim=1)  # (T, E)
    return scores.masked_fill(~allowed, float("-inf"))


# -- the router ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Routing:
    """What the router decided for ``T`` tokens."""

    logits: torch.Tensor  # (T, n_experts), with the skew's bonus; carries the router's gradient
    probs: torch.Tensor  # (T, n_experts), softmax over all experts
    preference: torch.Tensor  # (T, n_experts), expert ids from most to least preferred (the bias counted)
    experts: torch.Tensor  # (T, k), the top-k: preference[:, :k]
    gates: torch.Tensor  # (T, k), from the affinities without the bias; carries the gradient
    balance_probs: torch.Tensor  # (T, n_experts), Switch's P_i per token under the gate function


def check_tokens(x: torch.Tensor, d_model: int, dtype: torch.dtype | None = None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != d_model:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"tokens must be a (tokens, d_model) tensor with d_model = {d_model}, got {shape}")
    if dtype is not None:
        same_dtype(x.dtype, dtype, "the tokens' dtype")


def route(x: torch.Tensor, router: torch.Tensor, cfg: MoEConfig, bias: torch.Tensor | None = None) -> Routing:
    """Score every expert for each token of ``x`` ``(T, d_model)`` with ``router`` ``(E, d_model)``; rank
    them by affinity plus ``bias`` (DeepSeek-V3's selection bias; ties: the lower expert id), only among
    each token's ``cfg.max_nodes`` best nodes when set; take the top ``k``; weight them by the gate
    function of ``cfg.gate`` applied to the affinities *without* the bias, times ``cfg.gate_scale``."""
    check_tokens(x, cfg.d_model, router.dtype)
    if tuple(router.shape) != (cfg.n_experts, cfg.d_model):
        raise ValueError(f"the router must be (n_experts, d_model) = ({cfg.n_experts}, {cfg.d_model}), "
                         f"got {tuple(router.shape)}")
    spec = GATES[cfg.gate]
    xs, rw = (x.float(), router.float()) if cfg.router_float32 else (x, router)
    logits = blocked_rows(lambda b: F.linear(b, rw), xs, cfg.n_experts) + preference_bias(cfg).to(x.device)
    affinity = spec.affinity(logits)  # (T, E)
    ranked = affinity.detach() if bias is None else affinity.detach() + bias.to(affinity.device)  # dtypes promote
    if cfg.max_nodes is not None:  # only the experts of each token's M best nodes
        ranked = limit_to_nodes(ranked, cfg.k, cfg.n_nodes, cfg.max_nodes)
    preference = torch.sort(ranked, dim=-1, descending=True, stable=True).indices  # (T, E)
    experts = preference[:, :cfg.k]  # (T, k), k distinct experts per token
    gates = spec.gates(affinity.gather(1, experts), logits)  # (T, k)
    if cfg.gate_scale != 1.0:
        gates = gates * cfg.gate_scale
    return Routing(logits, torch.softmax(logits, dim=-1), preference, experts, gates, spec.balance_probs(logits))
