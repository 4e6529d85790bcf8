"""The mixture-of-experts layer: route at home, dispatch by all-to-all, the experts, combine, the weighted sum.

GShard (Lepikhin et al. 2020, arXiv:2006.16668) and Switch Transformer (Fedus et al. 2021, arXiv:2101.03961):
each rank holds whole experts (``placement``) and its home tokens. Route at home (``routing.route``), cap
each expert's token-slots (``balance.assign``: a capacity factor drops or reroutes what overflows; ``None``
is dropless, as MegaBlocks, Gale et al. 2022, arXiv:2211.15841); an all-to-all sends each served slot's row
to a rank holding its expert, after a small all-to-all of the counts; each expert runs on its contiguous
rows, however many (MegaBlocks' grouped GEMM as a loop); the reverse all-to-all brings the results home,
where the gates weight them. ``all_to_all`` is differentiable: its backward is the reverse all-to-all
(Megatron-Core's ``_AllToAll``), so the router learns through the gates and each expert from every row it
served. ``ctx=None`` runs the same layer in one process, every expert here: the reference. Multiplies run on
fixed blocks of rows (``routing.blocked_rows``), so the layer on ranks equals it bit for bit. Measurement
attaches through ``probe``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from shardlib.core.experts.balance import Assignment, assign, served_gates, switch_aux_loss
from shardlib.core.experts.placement import DispatchPlan, ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, Routing, blocked_rows, route
from shardlib.core.model import mlp_reference
from shardlib.core.probe import NO_PROBE
from shardlib.core.toy import generator, weight


# -- weights -------------------------------------------------------------------------------------------------
class LocalExperts(NamedTuple):
    """Gated-MLP weights of the experts a rank holds, in ``placement.hosted`` order, ``(out, in)``."""

    gate: torch.Tensor  # (n_hosted, d_ff, d_model)
    up: torch.Tensor  # (n_hosted, d_ff, d_model)
    down: torch.Tensor  # (n_hosted, d_model, d_ff)


@dataclass(frozen=True)
class MoEWeights:
    """Router rows (unit norm) and every expert's gated MLP, stored ``(out, in)`` as ``F.linear`` takes them."""

    router: torch.Tensor  # (n_experts, d_model)
    gate: torch.Tensor  # (n_experts, d_ff, d_model)
    up: torch.Tensor  # (n_experts, d_ff, d_model)
    down: torch.Tensor  # (n_experts, d_model, d_ff)

    n_experts = property(lambda self: self.router.shape[0])
    d_model = property(lambda self: self.router.shape[1])
    expert_bytes = property(lambda self: sum(w[0].numel() * w.element_size() for w in (self.gate, self.up, self.down)))

    def experts(self, ids=None) -> LocalExperts:
        """The experts ``ids`` (default: all), in that order."""
        ids = list(range(self.n_experts)) if ids is None else list(ids)
        return LocalExperts(self.gate[ids], self.up[ids], self.down[ids])


def make_moe_weights(cfg: MoEConfig, seed: int | torch.Generator = 0) -> MoEWeights:
    """Seeded weights (``toy.weight``, from ``seed`` or a generator): router rows of norm 1 (no expert favoured),
    then every expert's ``gate``, every ``up``, every ``down``."""
    g = seed if isinstance(seed, torch.Generator) else generator(seed)
    router = weight(g, cfg.n_experts, cfg.d_model)
    gate, up = (torch.stack([weight(g, cfg.d_ff, cfg.d_model) for _ in range(cfg.n_experts)]) for _ in range(2))
    down = torch.stack([weight(g, cfg.d_model, cfg.d_ff) for _ in range(cfg.n_experts)])
    return MoEWeights(router / router.norm(dim=1, keepdim=True), gate, up, down)


# -- the phases ----------------------------------------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """Forward: ``comm.all_to_all_single(x, ins, outs)``; backward: the same with ``ins`` and ``outs`` swapped."""

    @staticmethod
    def forward(fctx, x, comm, ins, outs, group):
        fctx.comm, fctx.ins, fctx.outs, fctx.group = comm, ins, outs, group
        return comm.all_to_all_single(x, ins, outs, group=group)

    @staticmethod
    def backward(fctx, grad):  # each row's gradient back to the rank that sent the row
        return fctx.comm.all_to_all_single(grad.contiguous(), fctx.outs, fctx.ins, group=fctx.group), *[None] * 4


def all_to_all(ctx, x: torch.Tensor, ins: list[int], outs: list[int], group=None) -> torch.Tensor:
    """A differentiable uneven all-to-all over ``group`` (``None``: every rank): send ``ins[j]`` rows of ``x``
    (dim 0, in order) to place ``j``, receive ``outs[j]`` from it. ``ctx=None``: one process, ``x`` itself."""
    return x if ctx is None else _AllToAll.apply(x, ctx.comm, [int(i) for i in ins], [int(o) for o in outs], group)


class Routed(NamedTuple):
    """One rank's routing, its capacity cap's verdict, where its served rows go."""

    routing: Routing
    assignment: Assignment
    plan: DispatchPlan


def route_and_plan(x: torch.Tensor, router: torch.Tensor, cfg: MoEConfig, placement: ExpertPlacement,
                   bias: torch.Tensor | None = None) -> Routed:
    """Route ``x`` ``(T, d_model)`` at home (``bias``: DeepSeek-V3's selection bias), cap, plan the dispatch."""
    routing = route(x, router, cfg, bias)  # experts, gates: (T, k)
    assignment = assign(routing, cfg)  # the expert serving each slot, or dropped
    return Routed(routing, assignment, dispatch_plan(assignment.experts, assignment.kept, placement))


def counts_in(ctx, counts: torch.Tensor, placement: ExpertPlacement, place: int, group=None) -> torch.Tensor:
    """``(ep, n_hosted)`` rows coming from each place for each expert hosted here (a small first all-to-all)."""
    hosted = len(placement.hosted(place))
    if ctx is None:
        return counts.view(1, hosted)
    sizes = [len(placement.hosted(r)) for r in range(placement.ep)]
    return ctx.comm.all_to_all_single(counts, sizes, [hosted] * placement.ep, group=group).view(placement.ep, hosted)


def run_experts(received: torch.Tensor, got: torch.Tensor, experts: LocalExperts) -> torch.Tensor:
    """Each hosted expert's gated MLP on its rows of ``received`` ``(rows, d_model)`` (arrived place by place,
    then expert by expert: ``got`` ``(ep, n_hosted)``), regrouped into one contiguous slice per expert."""
    n_hosted, d_model = got.shape[1], experts.down.shape[1]
    local = torch.arange(n_hosted, device=received.device).repeat(got.shape[0])  # (ep * n_hosted,) per block
    by_expert = torch.sort(local.repeat_interleave(got.flatten()), stable=True).indices  # arrival -> by expert
    parts = torch.split(received[by_expert], got.sum(0).tolist())  # each (rows of expert i, d_model)
    outs = [blocked_rows(lambda b, i=i: mlp_reference(b, experts.gate[i], experts.up[i], experts.down[i]),
                         part, d_model) for i, part in enumerate(parts)]
    out = torch.cat(outs) if outs else received.new_zeros(0, d_model)
    return torch.zeros_like(out).index_copy(0, by_expert, out)  # (rows, d_model), in arrival order again


def weighted_at_home(back: torch.Tensor, routed: Routed, cfg: MoEConfig) -> torch.Tensor:
    """The results back home ``(rows sent, d_model)`` to ``sum_s gate_s * output_s`` per token, in slot order
    (so a token's sum does not depend on the batch); a dropped slot weighs nothing."""
    kept = routed.assignment.kept  # (T, k)
    slots = back.new_zeros(kept.numel(), back.shape[1]).index_copy(0, routed.plan.order, back)  # (T * k, d_model)
    slots = slots.view(*kept.shape, -1)  # (T, k, d_model)
    gates = served_gates(routed.routing, routed.assignment, cfg)
    gates = torch.where(kept, gates, torch.zeros_like(gates))  # (T, k)
    out = gates[:, 0, None] * slots[:, 0]  # (T, d_model)
    for s in range(1, cfg.k):
        out = out + gates[:, s, None] * slots[:, s]
    return out


# -- the layer -----------------------------------------------------------------------------------------------
class MoEResult(NamedTuple):
    output: torch.Tensor  # (T, d_model): the experts' gate-weighted sum, no residual (the caller adds it)
    routing: Routing
    assignment: Assignment  # the expert serving each home token-slot, or dropped
    rows_to_rank: list[int]  # (ep,) rows sent to each place, this one included
    rows_from_rank: list[int]  # (ep,) rows this place's experts received from each place

    counts = property(lambda self: self.assignment.counts(self.routing.logits.shape[1]))  # (E,) slots served
    aux_loss = property(lambda self: switch_aux_loss(self.routing.experts, self.routing.balance_probs))  # Switch's


def moe_layer(x: torch.Tensor, router: torch.Tensor, experts, cfg: MoEConfig, bias: torch.Tensor | None = None, *,
              ctx=None, group=None, place: int | None = None, placement: ExpertPlacement | None = None,
              probe=NO_PROBE) -> MoEResult:
    """The layer on this rank's home tokens ``x`` ``(T, d_model)``; every rank of ``group`` (``None``: every
    rank; else this rank's ``place`` in it) calls it at once, and again in the backward. ``router``
    ``(n_experts, d_model)`` is whole on every rank; ``experts`` (gate, up, down) are the ones ``placement``
    (default: contiguous blocks over the group) hosts at this place. ``ctx=None``: one process, every expert
    here."""
    if group is not None and place is None:
        raise ValueError("the layer on a group of ranks needs this rank's place in the group (its expert block)")
    ep = 1 if ctx is None else ctx.comm.group_size(group)
    place = 0 if ctx is None else ctx.rank if group is None else place
    placement = ExpertPlacement(cfg.n_experts, ep) if placement is None else placement
    experts = LocalExperts(*experts)
    hosted = len(placement.hosted(place)) if placement.ep == ep else -1
    if hosted != experts.gate.shape[0] or tuple(experts.gate.shape[1:]) != (cfg.d_ff, cfg.d_model):
        raise ValueError(f"this rank must hold {hosted} experts of (d_ff, d_model) = ({cfg.d_ff}, {cfg.d_model}) "
                         f"({cfg.n_experts} experts placed on {placement.ep} ranks, the layer runs on {ep}), got "
                         f"gate weights {tuple(experts.gate.shape)}")
    with probe.span("route", kind="compute"):
        routed = route_and_plan(x, router, cfg, placement, bias)
    got = counts_in(ctx, routed.plan.counts, placement, place, group)  # (ep, n_hosted)
    rows_to, rows_from = routed.plan.rows_to_rank, got.sum(1).tolist()
    received = all_to_all(ctx, x[routed.plan.order // cfg.k], rows_to, rows_from, group)  # dispatch: (rows in, d)
    with probe.span("experts", kind="compute", rows=received.shape[0]):
        out = run_experts(received, got, experts)  # (rows in, d_model)
    back = all_to_all(ctx, out, rows_from, rows_to, group)  # combine: splits swapped, (rows sent, d_model)
    with probe.span("weighted sum", kind="compute"):
        y = weighted_at_home(back, routed, cfg)  # (T, d_model)
    return MoEResult(y, routed.routing, routed.assignment, rows_to, rows_from)
