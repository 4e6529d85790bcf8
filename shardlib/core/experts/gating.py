"""The trainable router: the training layer's configuration, the gate functions, the top-k with a bias.

Three gate functions, one registry (``GATES``), each a ``GateSpec`` naming the model that uses it:

* ``"softmax-topk"`` (Mixtral, Jiang et al. 2024, arXiv:2401.04088): the top-k by logit, then a softmax
  over the k chosen logits; the gates sum to 1.
* ``"softmax-then-topk"`` (Switch Transformer, Fedus et al. 2021, arXiv:2101.03961; GShard; DeepSeek-V2):
  a softmax over every expert, then the k largest probabilities, not renormalised.
* ``"sigmoid-topk"`` (DeepSeek-V3, 2024, arXiv:2412.19437, eqs. 13-15): a sigmoid affinity per expert,
  the top-k by affinity plus a per-expert balancing bias, gates the chosen affinities normalised to sum
  to 1. The bias chooses; it never weighs.

The router's gradient flows through the gates only (the top-k is discrete); a selection ``bias``
(DeepSeek-V3's auxiliary-loss-free balancing, ``balance.bias_update``) joins the affinities for the
top-k only. Multiplies run on fixed blocks of rows (``routing.blocked_rows``). Pure: torch, no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from shardlib.core.checks import choice, number_at_least, positive_number, whole_number
from shardlib.core.experts.node_limited import check_node_limit, limit_to_nodes
from shardlib.core.experts.routing import blocked_rows, check_tokens

BALANCING = ("none", "aux-loss", "aux-free")


# -- the gate functions ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GateSpec:
    """One gate function: ``affinity`` turns ``(T, E)`` logits into the scores the top-k ranks (a bias is
    added to these for the choice only); ``gates`` turns the chosen experts' ``(T, k)`` affinities into
    their weights (it also sees all logits); ``balance_probs`` is the ``(T, E)`` distribution Switch's
    auxiliary loss averages (``P_i``)."""

    name: str
    source: str
    affinity: Callable[[torch.Tensor], torch.Tensor]
    gates: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (chosen affinities, logits) -> (T, k)
    balance_probs: Callable[[torch.Tensor], torch.Tensor]


def _normalised_sigmoid(logits: torch.Tensor) -> torch.Tensor:
    s = torch.sigmoid(logits)  # (T, E)
    return s / s.sum(dim=-1, keepdim=True)


GATES: dict[str, GateSpec] = {spec.name: spec for spec in (
    GateSpec("softmax-topk", "Mixtral: softmax over the k chosen logits",
             affinity=lambda logits: logits, gates=lambda chosen, logits: torch.softmax(chosen, dim=-1),
             balance_probs=lambda logits: torch.softmax(logits, dim=-1)),
    GateSpec("softmax-then-topk", "Switch Transformer, GShard, DeepSeek-V2: softmax over all experts, then the "
             "top-k probabilities", affinity=lambda logits: torch.softmax(logits, dim=-1),
             gates=lambda chosen, logits: chosen, balance_probs=lambda logits: torch.softmax(logits, dim=-1)),
    GateSpec("sigmoid-topk", "DeepSeek-V3: sigmoid affinities, the chosen ones normalised to sum to 1",
             affinity=torch.sigmoid, gates=lambda chosen, logits: chosen / chosen.sum(dim=-1, keepdim=True),
             balance_probs=_normalised_sigmoid),
)}


# -- configuration -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoETrainConfig:
    """A dropless MoE layer that trains: ``n_experts`` gated-MLP experts of width ``d_model`` x ``d_ff``,
    ``k`` per token, no capacity (every token-slot is served: MegaBlocks, Megatron-Core). ``gate`` names
    one of ``GATES``. ``balance``: ``"aux-loss"`` adds Switch's auxiliary loss times ``aux_loss_coef``
    (Switch's alpha, 1e-2) to the loss; ``"aux-free"`` moves a selection bias by ``bias_rate`` per step
    (DeepSeek-V3's gamma, 1e-3 there; a toy trained for a few steps needs more); ``"none"`` neither."""

    n_experts: int = 8
    k: int = 2
    d_model: int = 16
    d_ff: int = 32
    gate: str = "softmax-topk"
    balance: str = "none"
    aux_loss_coef: float = 0.01
    bias_rate: float = 0.01
    n_nodes: int = 1  # the nodes the experts sit on, in contiguous blocks (``node_limited``)
    max_nodes: int | None = None  # M: the nodes one token may reach (DeepSeek-V3: 4 of 8); None: no limit

    def __post_init__(self) -> None:
        for name in ("n_experts", "d_model", "d_ff"):
            whole_number(getattr(self, name), name)
        if not isinstance(self.k, int) or isinstance(self.k, bool) or not 1 <= self.k <= self.n_experts:
            raise ValueError(f"k (experts per token) must be a whole number from 1 to n_experts = {self.n_experts}: "
                             f"a token cannot go to {self.k!r} different experts out of {self.n_experts}")
        choice(self.gate, tuple(GATES), "gate (the router's gate function)")
        choice(self.balance, BALANCING, "balance (how the load is balanced)")
        number_at_least(self.aux_loss_coef, "aux_loss_coef (Switch's alpha)")
        positive_number(self.bias_rate, "bias_rate (DeepSeek-V3's gamma, the bias step per training step)")
        check_node_limit(self.n_experts, self.k, self.n_nodes, self.max_nodes)

    @property
    def gate_spec(self) -> GateSpec:
        return GATES[self.gate]

    def experts_per_rank(self, ep: int) -> int:
        """Whole experts each of ``ep`` ranks holds, or a ValueError in the learner's terms."""
        whole_number(ep, "ep (ranks the experts are spread over)")
        if self.n_experts % ep:
            raise ValueError(f"ep = {ep} does not divide the {self.n_experts} experts: each rank of an expert-parallel "
                             f"group holds the same whole number of experts ({self.n_experts} / {ep} = "
                             f"{self.n_experts / ep:.3g}); use an ep that divides {self.n_experts}")
        return self.n_experts // ep

    def but(self, **changes) -> "MoETrainConfig":
        return replace(self, **changes)


# -- the router ----------------------------------------------------------------------------------------------
class TrainRouting(NamedTuple):
    logits: torch.Tensor  # (T, E), carries the router's gradient
    experts: torch.Tensor  # (T, k) long, chosen by affinity + bias; no gradient
    gates: torch.Tensor  # (T, k), from the affinities without the bias; carries the gradient
    balance_probs: torch.Tensor  # (T, E), Switch's P_i per token


def train_route(x: torch.Tensor, router: torch.Tensor, cfg: MoETrainConfig,
                bias: torch.Tensor | None = None) -> TrainRouting:
    """Score every expert for each token of ``x`` ``(T, d_model)`` with ``router`` ``(E, d_model)``; pick
    each token's top ``k`` by affinity plus ``bias`` (ties: the lower expert id); weight them by the gate
    function of ``cfg.gate`` applied to the affinities *without* the bias. With ``cfg.max_nodes`` the
    top-k is taken only among the experts of each token's ``max_nodes`` best nodes (``node_limited``)."""
    check_tokens(x, cfg.d_model, router.dtype)
    if tuple(router.shape) != (cfg.n_experts, cfg.d_model):
        raise ValueError(f"the router must be (n_experts, d_model) = ({cfg.n_experts}, {cfg.d_model}), "
                         f"got {tuple(router.shape)}")
    spec = cfg.gate_spec
    logits = blocked_rows(lambda b: F.linear(b, router), x, cfg.n_experts)  # (T, E)
    affinity = spec.affinity(logits)  # (T, E)
    ranked = affinity.detach() if bias is None else affinity.detach() + bias.to(affinity.device, affinity.dtype)
    if cfg.max_nodes is not None:  # DeepSeek-V3's node limit: only the experts of each token's M best nodes
        ranked = limit_to_nodes(ranked, cfg.k, cfg.n_nodes, cfg.max_nodes)
    experts = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[:, :cfg.k]  # (T, k)
    gates = spec.gates(affinity.gather(1, experts), logits)  # (T, k)
    return TrainRouting(logits, experts, gates, spec.balance_probs(logits))
