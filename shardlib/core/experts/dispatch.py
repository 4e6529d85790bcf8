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
attaches through ``probe``. ``moe_two_microbatches`` overlaps two microbatches (DualPipe's point);
``moe_reference`` is a block's MoE MLP in one process
(Mixtral, Jiang et al. 2024), ``moe_stack_*`` the toy transformer with MoE MLPs and its one-process forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.experts.balance import Assignment, assign, served_gates, switch_aux_loss
from shardlib.core.experts.placement import DispatchPlan, ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, Routing, blocked_rows, route
from shardlib.core.model import mlp_reference, stack_reference
from shardlib.core.probe import NO_PROBE
from shardlib.core.toy import attention_weights, generator, weight


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
    slots = slots.view(*kept.shape, back.shape[1])  # (T, k, d_model)
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
    here. ``ctx`` is read for its ``comm`` only (a ``TPGroup`` will do), and for its rank if ``place`` is not
    given."""
    if group is not None and place is None:
        raise ValueError("the layer on a group of ranks needs this rank's place in the group (its expert block)")
    ep = 1 if ctx is None else ctx.comm.group_size(group)
    place = 0 if ctx is None else ctx.rank if place is None else place
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


# -- two microbatches, one's all-to-all under the other's experts -------------------------------------------
def moe_two_microbatches(ctx, xs: list[torch.Tensor], experts: LocalExperts, router: torch.Tensor,
                         cfg: MoEConfig, overlap: bool = True, probe=NO_PROBE) -> list[torch.Tensor]:
    """The layer's phases (no residual) on two microbatches ``xs`` of this rank's tokens, each ``(T_mb,
    d_model)``, the experts over every rank; every rank calls it at once with the same ``overlap``. DualPipe
    (DeepSeek-V3, 2024, arXiv:2412.19437, section 3.2.1) runs one chunk's all-to-all under another's
    computation: A's dispatch is exposed, B's dispatch flies under A's experts, A's combine under B's
    experts, B's combine is exposed again: with expert phases longer than an all-to-all, half the rows'
    all-to-alls hide (each ``wait()`` logs the time blocked). ``overlap=False`` runs A then B. Forward only."""
    if len(xs) != 2:
        raise ValueError(f"the overlap pairs two microbatches, got {len(xs)}")
    comm, placement = ctx.comm, ExpertPlacement(cfg.n_experts, ctx.world_size)
    with torch.no_grad():
        with probe.span("route", kind="compute"):
            routed = [route_and_plan(x, router, cfg, placement) for x in xs]
        got = [counts_in(ctx, r.plan.counts, placement, ctx.rank) for r in routed]  # both counts first
        rows_to, rows_from = [r.plan.rows_to_rank for r in routed], [g.sum(1).tolist() for g in got]
        sends = [x[r.plan.order // cfg.k] for x, r in zip(xs, routed)]  # (rows out, d_model) each

        def dispatch(i, async_op):
            return comm.all_to_all_single(sends[i], rows_to[i], rows_from[i], async_op=async_op)

        def run(i, received):
            with probe.span("experts", kind="compute", rows=received.shape[0]):
                return run_experts(received, got[i], experts)

        def combine(i, out, async_op):
            return comm.all_to_all_single(out, rows_from[i], rows_to[i], async_op=async_op)

        if not overlap:  # A, then B: every all-to-all exposed
            return [weighted_at_home(combine(i, run(i, dispatch(i, False)), False), routed[i], cfg) for i in (0, 1)]
        received_a = dispatch(0, True).wait()  # exposed: nothing to compute yet
        flying_b = dispatch(1, True)  # B's rows in flight ...
        out_a = run(0, received_a)  # ... under A's experts
        received_b = flying_b.wait()
        flying_a = combine(0, out_a, True)  # A's results in flight ...
        out_b = run(1, received_b)  # ... under B's experts
        back_a = flying_a.wait()
        flying_b = combine(1, out_b, True)  # exposed, but for A's weighted sum
        y_a = weighted_at_home(back_a, routed[0], cfg)
        return [y_a, weighted_at_home(flying_b.wait(), routed[1], cfg)]


# -- the toy transformer with MoE MLPs ---------------------------------------------------------------------
EXPERT_KEYS = ("expert_gate", "expert_up", "expert_down")


def layer_experts(w: dict, ids: slice | None = None) -> LocalExperts:
    """A block's experts ``ids`` (default: all) as the MoE layer takes them."""
    return LocalExperts(*(w[k] if ids is None else w[k][ids] for k in EXPERT_KEYS))


def moe_stack_weights(model: ModelConfig, seed: int = 0) -> list[dict]:
    """``model.n_layers`` blocks from one generator: ``toy.attention_weights``, then ``make_moe_weights``."""
    cfg, g = MoEConfig.from_model(model), generator(seed)
    layers = []
    for _ in range(model.n_layers):
        w, moe = attention_weights(g, model), make_moe_weights(cfg, g)
        layers.append({**w, "router": moe.router, **dict(zip(EXPERT_KEYS, moe.experts()))})
    return layers


SHARED_KEYS = ("shared_gate", "shared_up", "shared_down")  # DeepSeek's shared experts, fused into one gated MLP


def shared_experts(rows: torch.Tensor, w: dict) -> torch.Tensor:
    """What every token adds besides its routed experts (DeepSeek-V3's shared experts, one gated MLP as wide as
    all of them): ``(tokens, d_model)``; zeros when the block has none."""
    if SHARED_KEYS[0] not in w:
        return torch.zeros_like(rows)
    return blocked_rows(lambda b: mlp_reference(b, *(w[k] for k in SHARED_KEYS)), rows, rows.shape[1])


def moe_reference(n: torch.Tensor, w: dict, model: ModelConfig) -> torch.Tensor:
    """Block ``w``'s MoE MLP in one process (``model.block_reference``'s ``moe``): the normed tokens ``n``
    ``(..., d_model)`` as rows through the layer with every expert here (the ``router_bias`` choosing, if the
    block has one), plus its shared experts; the same shape out."""
    rows = n.reshape(-1, n.shape[-1])  # (tokens, d_model)
    out = moe_layer(rows, w["router"], layer_experts(w), MoEConfig.from_model(model), w.get("router_bias")).output
    return (out + shared_experts(rows, w) if SHARED_KEYS[0] in w else out).view(n.shape)


def moe_stack_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig) -> torch.Tensor:
    """Every block in one process, ``h = h + attention(norm h)``, ``h = h + moe(norm h)``: ``x`` ``(batch, seq,
    d_model)`` in, the same shape out."""
    return stack_reference(x, layers, model, moe=moe_reference)
