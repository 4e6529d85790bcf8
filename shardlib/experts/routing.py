"""Mixture-of-experts routing: the router, its load, capacity and rerouting.

A mixture-of-experts (MoE) layer replaces one MLP with ``n_experts`` MLPs ("experts") and a router, a
``(n_experts, d_model)`` matrix that scores every expert for every token. Each token is sent to its
``k`` best-scoring experts and its output is their results weighted by *gates* (Shazeer et al. 2017;
GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021; Mixtral, Jiang et al. 2024).

Gates. With ``renormalize=True`` (the default, as in Mixtral) the gates are a softmax over the ``k``
chosen logits only, so a token's gates sum to 1. With ``renormalize=False`` they are the router's
softmax over all experts, read at the chosen ones (Switch Transformer's top-1 gate), and sum to less
than 1 when ``k < n_experts``.

The load-imbalance knob. ``skew`` in ``[0, 1]`` adds a bonus ``b`` to one expert's logit (``hot_expert``):
the bonus that would give that expert a router probability ``p = 1/n + skew (1 - 1/n)`` for a token
that has no other preference (all logits equal), ``b = log((n - 1) p / (1 - p))``. ``skew = 0`` adds
nothing: the router weights are random rows of equal norm, so every expert is equally preferred and the
load is uniform up to sampling noise. ``skew = 1`` adds ``MAX_PREFERENCE_BIAS``, far beyond any gap
between these unit-scale logits: every token ranks the hot expert first. The bonus enters the gates
too, so at a high skew the hot expert also takes nearly all of each token's weight. Everything is seeded.

Capacity (GShard, Switch Transformer). An expert takes at most
``capacity = ceil(tokens * k * capacity_factor / n_experts)`` token-slots from each group of tokens
routed together (GShard's "groups"; on ranks, each rank's tokens are one group). Slots are served in
priority order, every token's first choice before any second choice, and earlier tokens first. A slot
that does not fit is *dropped*: it contributes nothing, so a token whose slots were all dropped leaves
the layer unchanged through the residual connection. With ``reroute=True`` an overflowing slot tries
the token's next-preferred expert that still has room.

What a rerouted slot weighs is a choice, and systems differ (``reroute_gate``). ``"keep"`` (this
library's default): the slot keeps the gate its first-choice expert earned, and only the expert
changes, so the token's gates still sum to what the router gave. ``"rescore"``: a token with a rerouted
slot has its gates computed again from the router's scores of the experts that actually serve it (a
softmax over those logits when ``renormalize``, the router's probabilities of those experts otherwise),
as if the router had chosen them. A third answer, giving the slot no weight at all, is the capacity cap
without rerouting: the slot is dropped.

Exactness. A matrix multiply's last bits can depend on how many rows share the call (the BLAS library
picks different kernels for different batch sizes and thread counts). Here every multiply runs on
fixed blocks of ``BLOCK_ROWS`` rows, zero-padded (``blocked_rows``), so a token's result never depends
on which other tokens shared its call: the expert-parallel layer on ranks (gloo, CPU) reproduces the
single-process layer bit for bit.

Pure: torch tensors, never ``torch.distributed``. Capacity and rerouting act on nothing but the
router's output; the layer that puts router, experts and gates together is in ``layer``, the rank
version in ``ranks``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..checks import choice, flag, number_between, positive_number, same_dtype, whole_number, whole_number_between
from ..models import ModelConfig

BLOCK_ROWS = 64  # rows per matrix-multiply call (see "Exactness" above)
MAX_PREFERENCE_BIAS = 1e4  # the hot expert's logit bonus at skew = 1
REROUTE_GATES = ("keep", "rescore")  # what a rerouted slot weighs (see "Capacity" above)


# -- configuration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoEConfig:
    """Shapes and routing policy of one MoE layer. See the module docstring for each knob."""

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
    """The ``(n_experts,)`` logit bonus the skew knob adds: zero except at ``cfg.hot_expert``."""
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
    """``fn`` applied to ``rows`` in zero-padded blocks of ``BLOCK_ROWS`` (see "Exactness"): the rows'
    results do not depend on how many rows came with them."""
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


def aux_load_balancing_loss(routing: Routing) -> float:
    """Switch Transformer's auxiliary loss (eq. 4, without its scale alpha): ``n * sum_i f_i * P_i``.

    ``f_i`` is the share of token-slots routed to expert ``i`` (all ``k`` choices, before any capacity
    cap; GShard counts only first choices), ``P_i`` the router probability of expert ``i`` averaged over
    tokens. Both are ``1/n`` when the load is uniform, giving 1; all tokens on one expert that also takes
    all the probability gives ``n``. Training adds it to the loss to pull the router towards balance.
    """
    n = routing.probs.shape[1]
    f = torch.bincount(routing.experts.flatten(), minlength=n).double() / routing.experts.numel()
    return float(n * (f * routing.probs.double().mean(0)).sum())


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

    @property
    def dropped_slots(self) -> int:
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self) -> int:
        """Tokens none of whose slots were served: the layer passes them through unchanged."""
        return int((~self.kept).all(dim=1).sum())

    @property
    def rerouted_slots(self) -> int:
        return int(self.rerouted.sum())

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
    """Apply ``cfg``'s capacity cap (and rerouting) to one group of tokens."""
    final = routing.experts.clone()  # (T, k)
    n_tokens, k = final.shape
    if cfg.capacity_factor is None:
        no = torch.zeros_like(final, dtype=torch.bool)
        return Assignment(final, ~no, no, None)
    cap = capacity(n_tokens, k, cfg.capacity_factor, cfg.n_experts)
    room = torch.full((cfg.n_experts,), cap, dtype=torch.long)
    # priority: slot-major (every first choice before any second choice), then token order
    order = torch.arange(n_tokens * k).view(n_tokens, k).T.flatten()  # flat slot ids t * k + s
    kept = torch.zeros(n_tokens * k, dtype=torch.bool)
    kept[order] = _fill(order, final.flatten()[order], room)
    rerouted = torch.zeros(n_tokens * k, dtype=torch.bool)
    if cfg.reroute:
        next_choice = torch.full((n_tokens,), k, dtype=torch.long)  # index into each token's preference list
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
    """``(T, k)`` gates the weighted sum uses under ``cfg.reroute_gate``: the router's gates, except that
    with ``"rescore"`` a token with a rerouted slot gets gates computed from the router's scores of the
    experts that serve it (dropped slots excluded). Row by row, so a token's gates do not depend on the
    batch."""
    if cfg.reroute_gate == "keep" or not bool(assignment.rerouted.any()):
        return routing.gates
    if cfg.renormalize:
        served_logits = routing.logits.gather(1, assignment.experts)  # (T, k): the experts that serve each slot
        rescored = torch.softmax(served_logits.masked_fill(~assignment.kept, float("-inf")), dim=-1)
    else:
        rescored = routing.probs.gather(1, assignment.experts)
    rescored = torch.where(assignment.kept, rescored, torch.zeros_like(rescored))  # a dropped slot weighs nothing
    return torch.where(assignment.rerouted.any(dim=1, keepdim=True), rescored, routing.gates)


def split_groups(n_tokens: int, n_groups: int) -> list[tuple[int, int]]:
    """Contiguous ``(start, stop)`` token ranges of ``n_groups`` near-equal groups (as ``tensor_split``)."""
    whole_number(n_groups, "n_groups")
    if n_groups > n_tokens:
        raise ValueError(f"{n_tokens} tokens cannot be split into {n_groups} groups: each group (each rank) "
                         f"needs at least one token")
    base, extra = divmod(n_tokens, n_groups)
    bounds, start = [], 0
    for g in range(n_groups):
        stop = start + base + (1 if g < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def assign_groups(routing: Routing, cfg: MoEConfig, n_groups: int = 1) -> Assignment:
    """``assign`` on each of ``n_groups`` contiguous groups of tokens, joined back together."""
    parts = [assign(_slice(routing, a, b), cfg) for a, b in split_groups(routing.experts.shape[0], n_groups)]
    return Assignment(torch.cat([p.experts for p in parts]), torch.cat([p.kept for p in parts]),
                      torch.cat([p.rerouted for p in parts]), parts[0].capacity)


def _slice(routing: Routing, start: int, stop: int) -> Routing:
    return Routing(*(t[start:stop] for t in (routing.logits, routing.probs, routing.preference,
                                             routing.experts, routing.gates)))


# -- load statistics -------------------------------------------------------------------------------------------
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
