"""The experts' load read and balanced from outside the layer: load statistics, the auxiliary loss's value,
the mitigations notebook 04 compares, and DeepSeek-V3's bias balancing played over batches."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from shardlib.core.checks import choice, positive_number
from shardlib.core.experts.balance import bias_update, switch_aux_loss
from shardlib.core.experts.routing import MoEConfig, Routing


# -- load statistics ---------------------------------------------------------------------------------------
def aux_load_balancing_loss(routing: Routing) -> float:
    """Switch Transformer's auxiliary loss (eq. 4, without its scale alpha): ``n * sum_i f_i * P_i``.

    ``f_i`` is the share of token-slots routed to expert ``i`` (all ``k`` choices, before any capacity
    cap; GShard counts only first choices), ``P_i`` the router probability of expert ``i`` averaged over
    tokens. Both are ``1/n`` when the load is uniform, giving 1; all tokens on one expert that also takes
    all the probability gives ``n``. Training adds it to the loss to pull the router towards balance.
    """
    return float(switch_aux_loss(routing.experts, routing.probs.double()))


@dataclass(frozen=True)
class LoadStats:
    """How evenly a load (tokens per expert, or per rank) is spread."""

    loads: tuple[int, ...]
    max_over_mean: float  # 1.0 is perfectly even; n means everything on one of n
    cv: float  # coefficient of variation: population std / mean

    def __str__(self) -> str:
        return f"max/mean {self.max_over_mean:.2f}, CV {self.cv:.2f}, loads {list(self.loads)}"


def load_stats(loads, total: float | None = None) -> LoadStats:
    """Max/mean and coefficient of variation of a sequence of loads.

    ``total`` is the load that was to be shared out (default: the sum of ``loads``). Pass every
    requested token-slot, dropped ones included, to measure the busiest against the even share of the
    whole batch: a capacity cap then shows as a lower maximum rather than as a lower mean. The CV is
    always taken around the loads' own mean.
    """
    values = [int(v) for v in (loads.tolist() if isinstance(loads, torch.Tensor) else loads)]
    if not values:
        raise ValueError("load_stats needs at least one load")
    mean = sum(values) / len(values)
    share = mean if total is None else total / len(values)
    if share <= 0:
        return LoadStats(tuple(values), 1.0, 0.0)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return LoadStats(tuple(values), max(values) / share, std / mean if mean else 0.0)


# -- the mitigations -------------------------------------------------------------------------------------------
MITIGATIONS = ("none", "capacity", "capacity + reroute", "replicate hottest")


def mitigated(cfg: MoEConfig, mitigation: str, capacity_factor: float = 1.25) -> MoEConfig:
    """``cfg`` with ``mitigation``'s routing policy (replication changes the placement, not the policy)."""
    choice(mitigation, MITIGATIONS, "mitigation")
    if mitigation == "capacity":
        return cfg.but(capacity_factor=capacity_factor, reroute=False)
    if mitigation == "capacity + reroute":
        return cfg.but(capacity_factor=capacity_factor, reroute=True)
    return cfg.but(capacity_factor=None, reroute=False)


# -- auxiliary-loss-free balancing (DeepSeek-V3) -------------------------------------------------------------
@dataclass(frozen=True)
class BiasBalancing:
    """``balance_by_bias`` over a run of batches: per batch the busiest expert's load over the mean (before
    that batch's update), the bias after the last batch, and the last batch's routing and choice."""

    max_over_mean: tuple[float, ...]
    bias: torch.Tensor  # (n_experts,)
    routing: Routing  # the last batch, unbiased scores
    experts: torch.Tensor  # (T, k) the last batch's experts, chosen with the bias
    gates: torch.Tensor  # (T, k) their gates, from the unbiased scores


def balance_by_bias(batches, router: torch.Tensor, cfg: MoEConfig, rate: float = 0.1) -> BiasBalancing:
    """DeepSeek-V3's auxiliary-loss-free balancing, batch by batch: choose each token's top-k by its
    scores plus a per-expert ``bias`` (``(n_experts,)``, starting at 0); weight the chosen experts by gates
    from the scores without the bias (a softmax over the chosen ones, as ``route``); then move the bias by
    ``rate`` towards balance: down for each expert that took more token-slots than the mean, up for each
    that took fewer. Nothing is dropped and no loss term is added."""
    from shardlib.core.experts.routing import route

    positive_number(rate, "rate (the bias update per batch)")
    bias = torch.zeros(cfg.n_experts)
    loads = []
    batches = list(batches)
    if not batches:
        raise ValueError("balance_by_bias needs at least one batch of tokens")
    for x in batches:
        routing = route(x, router, cfg)  # (T, E) scores with the skew, no balancing bias
        experts = torch.sort(routing.logits + bias, dim=-1, descending=True, stable=True).indices[:, :cfg.k]
        counts = torch.bincount(experts.flatten(), minlength=cfg.n_experts).to(torch.float64)  # (E,)
        loads.append(float(counts.max() / counts.mean()))
        bias = bias_update(bias, counts, rate)
    gates = cfg.gate_spec.gates(cfg.gate_spec.affinity(routing.logits).gather(1, experts), routing.logits)
    return BiasBalancing(tuple(loads), bias, routing, experts, gates)
