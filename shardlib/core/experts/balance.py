"""Balancing the experts' load: capacity, dropping and rerouting; Switch's auxiliary loss; DeepSeek-V3's bias.

Capacity (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021): an expert takes at most
``ceil(tokens * k * capacity_factor / n_experts)`` token-slots from each group of tokens routed together
(on ranks, each rank's tokens are one group); a slot that does not fit is dropped, or with ``reroute``
tries the token's next choice with room. What a rerouted slot weighs is a choice (``served_gates``).
Switch's auxiliary loss pulls the router towards balance (``switch_aux_loss``); DeepSeek-V3 (2024, section
2.1.2) instead moves a selection bias after each step, down for the busy experts (``bias_update``).
Pure: acts on the router's output only; torch, never ``torch.distributed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlib.core.checks import positive_number, whole_number, whole_number_between
from shardlib.core.experts.routing import MoEConfig, Routing


# -- capacity, dropping, rerouting ---------------------------------------------------------------------------
def capacity(n_tokens: int, k: int, capacity_factor: float, n_experts: int) -> int:
    """Token-slots one expert takes from a group: ``ceil(n_tokens * k * capacity_factor / n_experts)``."""
    whole_number(n_tokens, "n_tokens", 0)
    whole_number(n_experts, "n_experts")
    whole_number_between(k, "k (experts per token)", 1, n_experts)
    positive_number(capacity_factor, "capacity_factor")
    # rounded first so that e.g. 8 * 2 * 1.1 / 8 = 2.2000000000000002 does not become 3
    return math.ceil(round(n_tokens * k * capacity_factor / n_experts, 9))


@dataclass(frozen=True)
class Assignment:
    """Which expert serves each token-slot after the capacity cap, and whether it is served at all."""

    experts: torch.Tensor  # (T, k), the final expert of each slot (a rerouted slot's new expert)
    kept: torch.Tensor  # (T, k) bool, False: dropped
    rerouted: torch.Tensor  # (T, k) bool
    capacity: int | None  # per expert per group; None: no cap

    dropped_slots = property(lambda self: int((~self.kept).sum()))
    dropped_tokens = property(lambda self: int((~self.kept).all(dim=1).sum()))  # all slots dropped: unchanged
    rerouted_slots = property(lambda self: int(self.rerouted.sum()))

    def counts(self, n_experts: int) -> torch.Tensor:
        """``(n_experts,)`` token-slots each expert serves."""
        return torch.bincount(self.experts[self.kept], minlength=n_experts)


def _fill(slot_ids: torch.Tensor, experts: torch.Tensor, room: torch.Tensor) -> torch.Tensor:
    """Serve slots in the order given while their expert has room; update ``room``; return a keep mask."""
    onehot = F.one_hot(experts, room.shape[0])  # (N, E)
    position = (onehot.cumsum(0) * onehot).sum(1) - 1  # (N,): how many earlier slots chose the same expert
    keep = position < room[experts]
    room -= torch.bincount(experts[keep], minlength=room.shape[0])
    return keep


def assign(routing: Routing, cfg: MoEConfig) -> Assignment:
    """Apply ``cfg``'s capacity cap (and rerouting) to one group of tokens. Slots are served in priority
    order, every token's first choice before any second choice, earlier tokens first; a dropped slot
    contributes nothing (a token with all its slots dropped passes through the residual unchanged)."""
    final = routing.experts.clone()  # (T, k)
    n_tokens, k = final.shape
    if cfg.capacity_factor is None:
        no = torch.zeros_like(final, dtype=torch.bool)
        return Assignment(final, ~no, no, None)
    cap = capacity(n_tokens, k, cfg.capacity_factor, cfg.n_experts)
    on = final.device
    room = torch.full((cfg.n_experts,), cap, dtype=torch.long, device=on)
    # priority: slot-major (every first choice before any second choice), then token order
    order = torch.arange(n_tokens * k, device=on).view(n_tokens, k).T.flatten()  # flat slot ids t * k + s
    kept = torch.zeros(n_tokens * k, dtype=torch.bool, device=on)
    kept[order] = _fill(order, final.flatten()[order], room)
    rerouted = torch.zeros(n_tokens * k, dtype=torch.bool, device=on)
    if cfg.reroute:
        next_choice = torch.full((n_tokens,), k, dtype=torch.long, device=on)  # index into each token's preference list
        waiting = order[~kept[order]]  # overflowing slots, still in priority order
        while waiting.numel() and bool((next_choice < cfg.n_experts).any()):
            tokens = waiting // k
            candidate = torch.full_like(waiting, -1)
            for s in range(k):  # a token with several overflowing slots takes successive preferences
                mine = (waiting % k == s) & (next_choice[tokens] < cfg.n_experts)
                t = tokens[mine]
                candidate[mine] = routing.preference[t, next_choice[t]]
                next_choice[t] += 1
            trying = candidate >= 0
            slots, experts = waiting[trying], candidate[trying]
            served = _fill(slots, experts, room)
            final.view(-1)[slots[served]] = experts[served]
            kept[slots[served]] = True
            rerouted[slots[served]] = True
            waiting = slots[~served]
    return Assignment(final, kept.view(n_tokens, k), rerouted.view(n_tokens, k), cap)


def served_gates(routing: Routing, assignment: Assignment, cfg: MoEConfig) -> torch.Tensor:
    """``(T, k)`` gates the weighted sum uses: the router's, except that with ``reroute_gate="rescore"`` a
    token with a rerouted slot gets gates from the router's scores of the experts serving it (row by row)."""
    if cfg.reroute_gate == "keep" or not bool(assignment.rerouted.any()):
        return routing.gates
    if cfg.gate == "softmax-topk":
        served_logits = routing.logits.gather(1, assignment.experts)  # (T, k): the experts that serve each slot
        rescored = torch.softmax(served_logits.masked_fill(~assignment.kept, float("-inf")), dim=-1)
    elif cfg.gate == "softmax-then-topk":
        rescored = routing.probs.gather(1, assignment.experts)
    else:
        raise ValueError(f"reroute_gate='rescore' rescores with a softmax gate, not {cfg.gate!r}")
    rescored = torch.where(assignment.kept, rescored, torch.zeros_like(rescored))  # a dropped slot weighs nothing
    return torch.where(assignment.rerouted.any(dim=1, keepdim=True), rescored, routing.gates)


def switch_aux_loss(experts: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Switch Transformer's auxiliary loss (eq. 4, without its scale alpha), ``n * sum_i f_i * P_i``, for
    ``experts`` ``(T, k)`` chosen and ``probs`` ``(T, n)``. ``f_i`` is the share of token-slots routed to
    expert ``i`` (all ``k`` choices, before any capacity cap; GShard counts only first choices), a count with
    no gradient; ``P_i`` the probability of expert ``i`` averaged over tokens. Both are ``1/n`` when the load
    is uniform, giving 1; all tokens on one expert that also takes all the probability gives ``n``. The
    gradient flows through ``P_i``, pulling probability away from the busy experts."""
    n = probs.shape[1]
    f = torch.bincount(experts.flatten(), minlength=n).to(probs.dtype) / experts.numel()  # (n,)
    return n * (f * probs.mean(0)).sum()


def bias_update(bias: torch.Tensor, counts: torch.Tensor, rate: float) -> torch.Tensor:
    """DeepSeek-V3's update of the selection bias after a step: ``bias + rate * sign(mean load - load)``.
    ``counts`` ``(n_experts,)`` are the token-slots of the *whole* step: on ranks, summed over every rank
    first, so every rank's bias moves alike. A new tensor in ``bias``'s dtype."""
    if counts.shape != bias.shape:
        raise ValueError(f"counts has shape {tuple(counts.shape)}, the bias {tuple(bias.shape)}: one count per expert")
    counts = counts.to(torch.float64)
    return bias + rate * torch.sign(counts.mean() - counts).to(bias.dtype)
