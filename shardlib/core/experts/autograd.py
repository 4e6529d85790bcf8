"""Expert parallelism that trains: a differentiable all-to-all and the dropless layer on ranks.

The backward of an all-to-all is the reverse all-to-all: rank i sent ``ins[j]`` rows to rank j and
received ``outs[j]`` from it, so the rows' gradients go back with the split sizes swapped
(GShard, Lepikhin et al. 2020; Megatron-Core's ``_AllToAll``). ``all_to_all`` is that
``torch.autograd.Function``, through ``ctx.comm.all_to_all_single`` both ways, so the comm log records
the forward's two all-to-alls (dispatch, combine) and the backward's two.

``moe_forward`` is the layer on this rank's tokens: route at home (the gate function of
``routing.GATES``, a selection bias for DeepSeek-V3's balancing), exchange counts, dispatch the rows
(differentiable), each local expert on its rows (dropless: ``dropless.grouped_experts``), combine
(differentiable), the gate-weighted sum at home. The router's gradient comes back through the gates;
each expert's gradient gathers every rank's rows it served. Measurement attaches through ``probe``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from shardlib.core.experts.balance import switch_aux_loss
from shardlib.core.experts.dropless import gate_weighted_sum, grouped_experts, inverse_permutation
from shardlib.core.experts.routing import MoEConfig, Routing, route
from shardlib.core.probe import NO_PROBE


class _AllToAll(torch.autograd.Function):
    """Forward: ``comm.all_to_all_single(x, ins, outs)``. Backward: the same call on the gradient with
    ``ins`` and ``outs`` swapped, so each row's gradient returns to the rank that sent the row."""

    @staticmethod
    def forward(fctx, x, comm, ins, outs, group):
        fctx.comm, fctx.ins, fctx.outs, fctx.group = comm, ins, outs, group
        return comm.all_to_all_single(x, ins, outs, group=group)

    @staticmethod
    def backward(fctx, grad):
        return fctx.comm.all_to_all_single(grad.contiguous(), fctx.outs, fctx.ins, group=fctx.group), None, None, \
            None, None


def all_to_all(comm, x: torch.Tensor, ins: list[int], outs: list[int], group=None) -> torch.Tensor:
    """A differentiable uneven all-to-all over ``group`` (``None``: every rank): send ``ins[j]`` rows of
    ``x`` (dim 0, in order) to place ``j``, receive ``outs[j]`` from it."""
    return _AllToAll.apply(x, comm, [int(i) for i in ins], [int(o) for o in outs], group)


class LocalExperts(NamedTuple):
    """The experts this rank holds, as a block: ``first`` is the first one's id; gated MLP weights stored
    ``(out, in)`` as ``F.linear`` takes them."""

    gate: torch.Tensor  # (n_local, d_ff, d_model)
    up: torch.Tensor  # (n_local, d_ff, d_model)
    down: torch.Tensor  # (n_local, d_model, d_ff)

    @property
    def n_local(self) -> int:
        return self.gate.shape[0]


class MoEAux(NamedTuple):
    """What ``moe_forward`` knows besides its output, on this rank's tokens."""

    aux_loss: torch.Tensor  # Switch's auxiliary loss over this rank's tokens (no coefficient), with gradient
    counts: torch.Tensor  # (n_experts,) token-slots this rank's tokens sent to each expert
    experts: torch.Tensor  # (T_r, k) the experts chosen for each home token
    gates: torch.Tensor  # (T_r, k)
    rows_to_rank: list[int]  # (ep,) rows sent to each place of the group, itself included
    rows_from_rank: list[int]  # (ep,) rows received from each place


def group_place(ctx, group) -> tuple[int, int]:
    """``(place, size)`` of this rank in ``group`` (``None``: the whole job)."""
    if group is None:
        return ctx.rank, ctx.world_size
    return dist.get_rank(group), dist.get_world_size(group)


def moe_forward(ctx, x: torch.Tensor, experts: LocalExperts, router: torch.Tensor, cfg: MoEConfig,
                group=None, bias: torch.Tensor | None = None, probe=NO_PROBE) -> tuple[torch.Tensor, MoEAux]:
    """The dropless MoE layer on this rank's tokens ``x`` ``(T_r, d_model)``, differentiable end to end.

    ``group`` is the expert-parallel process group (``None``: every rank); the rank at place ``p`` of its
    ``ep`` ranks holds experts ``p * n_local`` to ``(p + 1) * n_local - 1`` (``experts``, ``n_local =
    n_experts / ep``). ``router`` ``(n_experts, d_model)`` is the same on every rank. ``bias``
    ``(n_experts,)`` is added to the affinities for the top-k only (DeepSeek-V3). Every rank of the group
    calls it at once, and again in the backward (two all-to-alls each way).

    Returns ``(y, aux)``: ``y`` ``(T_r, d_model)`` is the gate-weighted sum of the experts' outputs, no
    residual (the caller adds it); ``aux`` holds Switch's auxiliary loss (add ``cfg.aux_loss_coef`` times
    it to the loss for ``balance="aux-loss"``), the counts per expert (sum them over the ranks for
    DeepSeek-V3's bias update) and the rows sent and received.
    """
    plan = plan_dispatch(ctx, x, experts, router, cfg, group, bias, probe)  # route at home, exchange counts
    # dispatch: each row to the place holding its expert (differentiable: the backward sends the gradients home)
    received = all_to_all(ctx.comm, x[plan.order // cfg.k], plan.rows_to, plan.rows_from, group)  # (rows in, d_model)
    with probe.span("experts", kind="compute", rows=received.shape[0]):
        out = local_expert_rows(received, plan.got, experts)  # dropless: each local expert on all its rows
    back = all_to_all(ctx.comm, out, plan.rows_from, plan.rows_to, group)  # combine: splits swapped, (T_r * k, d)
    with probe.span("weighted sum", kind="compute"):
        y = weighted_at_home(back, plan, cfg)  # (T_r, d_model)
    routing = plan.routing
    aux = MoEAux(switch_aux_loss(routing.experts, routing.balance_probs), plan.counts, routing.experts,
                 routing.gates, plan.rows_to, plan.rows_from)
    return y, aux


class TrainDispatchPlan(NamedTuple):
    """One rank's routing and where its rows go: what the dispatch, the experts and the combine need."""

    routing: Routing
    order: torch.Tensor  # (T_r * k,) slot ids t * k + s in send order: by expert, so by place, then expert
    counts: torch.Tensor  # (E,) token-slots this rank sends to each expert
    rows_to: list[int]  # (ep,) rows sent to each place
    got: torch.Tensor  # (ep, n_local) rows coming from each place for each local expert
    rows_from: list[int]  # (ep,) rows coming from each place


def plan_dispatch(ctx, x: torch.Tensor, experts: LocalExperts, router: torch.Tensor, cfg: MoEConfig,
                  group=None, bias: torch.Tensor | None = None, probe=NO_PROBE) -> TrainDispatchPlan:
    """Route ``x`` at home and exchange the counts, so every place knows how many rows will come for
    each of its experts (the first, small all-to-all of a dispatch)."""
    _, ep = group_place(ctx, group)
    n_local = cfg.experts_per_rank(ep)
    if experts.n_local != n_local or tuple(experts.gate.shape[1:]) != (cfg.d_ff, cfg.d_model):
        raise ValueError(f"this rank must hold {n_local} experts of (d_ff, d_model) = ({cfg.d_ff}, {cfg.d_model}) "
                         f"({cfg.n_experts} experts over ep = {ep}), got gate weights {tuple(experts.gate.shape)}")
    with probe.span("route", kind="compute"):
        routing = route(x, router, cfg, bias)  # experts, gates: (T_r, k)
        flat = routing.experts.flatten()  # (T_r * k,) slot t * k + s
        order = torch.sort(flat, stable=True).indices  # slots by expert, so by destination place, then expert
        counts = torch.bincount(flat, minlength=cfg.n_experts)  # (E,)
        rows_to = counts.view(ep, n_local).sum(1).tolist()  # (ep,)
    got = ctx.comm.all_to_all_single(counts, [n_local] * ep, [n_local] * ep, group=group).view(ep, n_local)
    return TrainDispatchPlan(routing, order, counts, rows_to, got, got.sum(1).tolist())


def local_expert_rows(received: torch.Tensor, got: torch.Tensor, experts: LocalExperts) -> torch.Tensor:
    """Each local expert on its rows of ``received`` ``(rows in, d_model)``, which arrive source by source
    and, within a source, expert by expert (``got`` ``(ep, n_local)``): regroup by expert, run
    ``dropless.grouped_experts``, and put the results back in the order the rows came."""
    n_local = got.shape[1]
    local = torch.arange(n_local, device=received.device).repeat(got.shape[0])  # (ep * n_local,) expert of each block
    local = local.repeat_interleave(got.flatten())  # (rows in,) the local expert of each row
    by_expert = torch.sort(local, stable=True).indices  # source-major to expert-major
    out = grouped_experts(received[by_expert], got.sum(0).tolist(), *experts)  # (rows in, d_model)
    return out[inverse_permutation(by_expert)]


def weighted_at_home(back: torch.Tensor, plan: TrainDispatchPlan, cfg: MoEConfig) -> torch.Tensor:
    """The rows back home ``(T_r * k, d_model)`` in send order, un-sorted to slot order and weighted by
    the gates: ``sum_s gate_s * expert_output_s`` per token."""
    slot_outputs = back[inverse_permutation(plan.order)].view(plan.routing.experts.shape[0], cfg.k, -1)
    return gate_weighted_sum(plan.routing.gates, slot_outputs)  # (T_r, d_model)
