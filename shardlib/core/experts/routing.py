"""The mixture-of-experts router: the layer's configuration, the load-imbalance knob, the top-k choice.

A router is a ``(n_experts, d_model)`` matrix that scores every expert for every token; each token goes
to its ``k`` best experts, weighted by gates (Shazeer et al. 2017, arXiv:1701.06538; GShard, Lepikhin et
al. 2020; Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al. 2024). Gates are a softmax over
the ``k`` chosen logits (``renormalize``, as Mixtral) or the router's probabilities of the chosen experts
(Switch Transformer). Every multiply runs on fixed blocks of rows (``blocked_rows``), so a token's result
never depends on which tokens shared the call. Notebook 04 explains each knob. Pure: torch, never
``torch.distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from shardlib.core.checks import (
    choice,
    flag,
    number_between,
    positive_number,
    same_dtype,
    whole_number,
    whole_number_between,
)
from shardlib.core.config import ModelConfig

BLOCK_ROWS = 64  # rows per matrix-multiply call (see ``blocked_rows``)
MAX_PREFERENCE_BIAS = 1e4  # the hot expert's logit bonus at skew = 1
REROUTE_GATES = ("keep", "rescore")  # what a rerouted slot weighs (see ``balance.served_gates``)


# -- configuration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoEConfig:
    """Shapes and routing policy of one MoE layer. ``skew`` in ``[0, 1]`` tilts every token towards
    ``hot_expert`` (``preference_bias``); ``capacity_factor``, ``reroute`` and ``reroute_gate`` are the
    capacity cap's policy (``balance``)."""

    n_experts: int = 8
    k: int = 2
    d_model: int = 64
    d_ff: int = 128
    renormalize: bool = True
    skew: float = 0.0
    hot_expert: int = 0
    capacity_factor: float | None = None  # None: no cap, nothing is dropped
    reroute: bool = False
    reroute_gate: str = "keep"  # a rerouted slot's gate: "keep" the first choice's, or "rescore"

    def __post_init__(self) -> None:
        for name in ("n_experts", "d_model", "d_ff"):
            whole_number(getattr(self, name), name)
        whole_number_between(self.k, "k (experts per token)", 1, self.n_experts)
        number_between(self.skew, "skew (0: uniform preferences, 1: one hot expert)", 0.0, 1.0)
        whole_number_between(self.hot_expert, "hot_expert", 0, self.n_experts - 1)
        flag(self.renormalize, "renormalize")
        flag(self.reroute, "reroute")
        choice(self.reroute_gate, REROUTE_GATES, "reroute_gate (what a rerouted slot weighs)")
        if self.capacity_factor is not None:
            positive_number(self.capacity_factor, "capacity_factor (1.0 gives each expert exactly its even share "
                                                  "of token-slots; None for no cap)")
        if self.reroute and self.capacity_factor is None:
            raise ValueError("reroute=True moves token-slots that overflow an expert's capacity, but "
                             "capacity_factor is None (no capacity): set a capacity_factor too")

    @classmethod
    def from_model(cls, model: ModelConfig, **overrides) -> "MoEConfig":
        """The layer shape of ``model`` (``n_experts``, ``experts_per_token``, ``d_model``, ``d_ff``)."""
        if not model.is_moe:
            raise ValueError(f"{model.name} is a dense model (n_experts = {model.n_experts}): no experts to route to")
        base = dict(n_experts=model.n_experts, k=model.experts_per_token, d_model=model.d_model, d_ff=model.d_ff)
        return cls(**{**base, **overrides})

    def but(self, **changes) -> "MoEConfig":
        """A copy with some fields changed (checked again)."""
        return replace(self, **changes)


def preference_bias(cfg: MoEConfig) -> torch.Tensor:
    """The ``(n_experts,)`` logit bonus the skew knob adds: zero except at ``cfg.hot_expert``.

    The bonus ``b`` would give the hot expert a router probability ``p = 1/n + skew (1 - 1/n)`` for a
    token with no other preference (all logits equal): ``b = log((n - 1) p / (1 - p))``. Skew 0 adds
    nothing (router rows of equal norm: every expert equally preferred); skew 1 adds
    ``MAX_PREFERENCE_BIAS``, far beyond any gap between these unit-scale logits, so every token ranks
    the hot expert first, and it takes nearly all of each token's gate too.
    """
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
    """``fn`` applied to ``rows`` in zero-padded blocks of ``BLOCK_ROWS``: the rows' results do not depend
    on how many rows came with them. A matrix multiply's last bits can depend on how many rows share the
    call (the BLAS library picks kernels by batch size and thread count); fixed blocks let the layer on
    ranks reproduce the single-process layer bit for bit."""
    n = rows.shape[0]
    if n == 0:
        return rows.new_zeros(0, out_features)
    pad = (-n) % BLOCK_ROWS
    if pad:
        rows = torch.cat([rows, rows.new_zeros(pad, rows.shape[1])])
    return torch.cat([fn(rows[i:i + BLOCK_ROWS]) for i in range(0, rows.shape[0], BLOCK_ROWS)])[:n]


# -- the router ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Routing:
    """What the router decided for ``T`` tokens."""

    logits: torch.Tensor  # (T, n_experts), with the skew's bonus
    probs: torch.Tensor  # (T, n_experts), softmax over all experts
    preference: torch.Tensor  # (T, n_experts), expert ids from most to least preferred
    experts: torch.Tensor  # (T, k), the top-k: preference[:, :k]
    gates: torch.Tensor  # (T, k)


def check_tokens(x: torch.Tensor, d_model: int, dtype: torch.dtype | None = None) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != d_model:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"tokens must be a (tokens, d_model) tensor with d_model = {d_model}, got {shape}")
    if dtype is not None:
        same_dtype(x.dtype, dtype, "the tokens' dtype")


def route(x: torch.Tensor, router: torch.Tensor, cfg: MoEConfig) -> Routing:
    """Score every expert for every token of ``x`` ``(T, d_model)`` and pick each token's top ``k``."""
    check_tokens(x, router.shape[1], router.dtype)
    if router.shape[0] != cfg.n_experts:
        raise ValueError(f"the router scores {router.shape[0]} experts but the config has {cfg.n_experts}")
    logits = blocked_rows(lambda b: F.linear(b, router), x, cfg.n_experts) + preference_bias(cfg)  # (T, E)
    probs = torch.softmax(logits, dim=-1)  # (T, E)
    preference = torch.sort(logits, dim=-1, descending=True, stable=True).indices  # ties: lower id first
    experts = preference[:, :cfg.k]  # (T, k), k distinct experts per token
    chosen = logits.gather(1, experts)  # (T, k)
    gates = torch.softmax(chosen, dim=-1) if cfg.renormalize else probs.gather(1, experts)
    return Routing(logits, probs, preference, experts, gates)
