"""The MoE training step on a rank: forward through ``autograd.moe_forward``, the loss, the backward, and
each gradient summed over the ranks that share its weight (``expert_groups``: a ``(world / ep) x ep`` grid).

* **Dense weights** (``w_in``, the router) sit on every rank and every rank's tokens touch them: their
  gradients are summed over **every rank** (the data-parallel group, here the whole job).
* **Expert weights** sit on one place of each ep group (``ep`` consecutive ranks). The combine's
  backward already brings an expert the gradient of every row it served from its own ep group; the
  other ep groups' copies of the same expert hold the rest, so its gradient is summed over the
  **expert-data-parallel group** (the ``world / ep`` ranks at the same place of each ep group;
  Megatron-Core's ``expert_data_parallel``). With ``ep = world`` there is one holder and nothing to sum.

Each rank's loss is divided by ``world`` before its backward, so the sums are the gradients of the mean
over the ``world`` token groups (``train_reference.reference_step``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.experts.autograd import LocalExperts, moe_forward
from shardlib.core.experts.balance import bias_update, split_groups
from shardlib.core.experts.routing import MoEConfig, blocked_rows

EXPERT_PARAMETERS = ("gate", "up", "down")


def check_ep_degree(cfg: MoEConfig, world_size: int, ep: int) -> int:
    """Experts per rank for ``ep`` on ``world_size`` ranks, or a ValueError in the learner's terms."""
    whole_number(ep, "ep (ranks the experts are spread over)")
    if ep > world_size or world_size % ep:
        raise ValueError(f"ep = {ep} on {world_size} ranks: the ranks must form whole expert-parallel groups of ep "
                         f"ranks each, so ep must divide the world size {world_size}")
    return cfg.experts_per_rank(ep)


def expert_groups(ctx, ep: int):
    """``(ep_group, edp_group)``: this rank's expert-parallel group (``ep`` consecutive ranks) and its
    expert-data-parallel group (the ranks ``ep`` apart), from one ``(world / ep) x ep`` mesh, made once
    per pool and logged as ``"ep"`` and ``"edp"``."""
    mesh = ctx.device_mesh((ctx.world_size // ep, ep), ("edp", "ep"))
    return mesh.get_group("ep"), mesh.get_group("edp")


def local_experts(weights: MoETrainWeights, place: int, n_local: int) -> LocalExperts:
    """The block of experts at ``place`` of an ep group, as fresh leaves that collect gradients."""
    block = slice(place * n_local, (place + 1) * n_local)
    return LocalExperts(*(getattr(weights, n)[block].detach().clone().requires_grad_(True)
                          for n in EXPERT_PARAMETERS))


@dataclass(frozen=True)
class MoEStep:
    """One step on one rank, after the reductions: the mean loss over every rank, this rank's reduced
    gradients (dense ones full, expert ones for its ``n_local`` experts from ``first_expert``), and the
    token-slots per expert over every rank."""

    loss: float
    grads: dict[str, torch.Tensor]
    first_expert: int
    counts: torch.Tensor  # (n_experts,) summed over every rank
    rows_to_rank: list[int]
    rows_from_rank: list[int]
    task_loss: float = 0.0  # the mean over every rank of the loss without the auxiliary term


def moe_train_step(ctx, x: torch.Tensor, target: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig,
                   ep: int, bias: torch.Tensor | None = None) -> MoEStep:
    """One training step of the toy (``train_reference``) on this rank's share of ``x`` ``(T, d_in)`` and
    ``target`` ``(T, d_model)`` (every rank passes the whole batch and keeps its contiguous share),
    with the experts spread over ``ep`` ranks: the gradients of the dense weights summed over every rank,
    those of the experts over the expert-data-parallel group (see the module's docstring for why)."""
    n_local = check_ep_degree(cfg, ctx.world_size, ep)
    ep_group, edp_group = expert_groups(ctx, ep)
    place = ctx.rank % ep
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    w_in = weights.w_in.detach().clone().requires_grad_(True)
    router = weights.router.detach().clone().requires_grad_(True)
    experts = local_experts(weights, place, n_local)
    h = project(x[start:stop], w_in)  # (T_r, d_model)
    y, aux = moe_forward(ctx, h, experts, router, cfg, group=ep_group, bias=bias)
    loss = group_loss(h + y, target[start:stop], aux.aux_loss, cfg)
    (loss / ctx.world_size).backward()
    grads = {"w_in": w_in.grad, "router": router.grad}
    for g in grads.values():  # dense: every rank's tokens used them
        ctx.comm.all_reduce(g)
    for name, w in zip(EXPERT_PARAMETERS, experts):  # experts: the other ep groups' copies
        grads[name] = w.grad
        if ctx.world_size > ep:
            ctx.comm.all_reduce(w.grad, group=edp_group)
    total = torch.stack([loss.detach(), task_loss(h + y, target[start:stop]).detach()]).to(torch.float64)
    total /= ctx.world_size
    ctx.comm.all_reduce(total)  # (loss, task loss), the means over every rank
    counts = aux.counts.clone()
    ctx.comm.all_reduce(counts)
    return MoEStep(float(total[0]), grads, place * n_local, counts, aux.rows_to_rank, aux.rows_from_rank,
                   float(total[1]))


@dataclass(frozen=True)
class MoETrainResult:
    """``steps`` SGD steps on one rank: per step the loss, the counts over every rank and the bias it
    chose with; the last step's reduced gradients; this rank's weights after the last step."""

    losses: list[float]
    counts: list[torch.Tensor]
    biases: list[torch.Tensor]
    last: MoEStep
    weights: dict[str, torch.Tensor]  # dense full, experts this rank's block
    first_expert: int
    comm_ops: list[tuple[str, str, int]]  # (op, group, bytes) of the last step, as the comm log has them
    task_losses: list[float] = ()


def moe_train_on_rank(ctx, x: torch.Tensor, target: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig,
                      ep: int, steps: int = 1, lr: float = 0.1) -> MoETrainResult:
    """``moe_train_step`` ``steps`` times with plain SGD; under ``balance="aux-free"`` the selection bias
    starts at 0 and moves by ``balance.bias_update`` on the counts summed over every rank, so every
    rank holds the same bias."""
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    n_local = check_ep_degree(cfg, ctx.world_size, ep)
    first = (ctx.rank % ep) * n_local
    bias = torch.zeros(cfg.n_experts, dtype=weights.router.dtype)
    losses, tasks, counts, biases = [], [], [], []
    for _ in range(steps):
        first_record = len(ctx.comm.records)
        step = moe_train_step(ctx, x, target, weights, cfg, ep, bias if cfg.balance == "aux-free" else None)
        losses.append(step.loss)
        tasks.append(step.task_loss)
        counts.append(step.counts)
        biases.append(bias.clone())
        new = {}
        for name in PARAMETERS:
            w = getattr(weights, name)
            if name in EXPERT_PARAMETERS:  # update this rank's block; the others' blocks are not ours to change
                w = w.clone()
                w[first:first + n_local] -= lr * step.grads[name]
            else:
                w = w - lr * step.grads[name]
            new[name] = w
        weights = MoETrainWeights(**new)
        if cfg.balance == "aux-free":
            bias = bias_update(bias, step.counts, cfg.bias_rate)
    ops = [(r.op, r.group, r.size_bytes) for r in ctx.comm.records[first_record:]]
    mine = {n: (getattr(weights, n)[first:first + n_local] if n in EXPERT_PARAMETERS else getattr(weights, n))
            for n in PARAMETERS}
    return MoETrainResult(losses, counts, biases, step, mine, first, ops, tasks)


@dataclass(frozen=True)
class NodeDispatch:
    """One rank's dispatch under a routing policy, each rank an emulated node: the chosen experts of its
    tokens and the wire bytes of two real all-to-alls of its rows, one row per token-slot and one per
    distinct remote node (DeepSeek-V3's dispatch sends a token to a node once)."""

    experts: torch.Tensor  # (T_r, k)
    slot_rows_to_rank: list[int]
    dedup_rows_to_rank: list[int]
    slot_wire_bytes: int  # rows to other ranks (other nodes), from the comm log
    dedup_wire_bytes: int


def node_dispatch_on_rank(ctx, x: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig) -> NodeDispatch:
    """Route this rank's share of ``x`` with ``cfg`` (node-limited when ``cfg.max_nodes`` is set), then send
    its rows to the ranks holding their experts twice: once per token-slot, once per distinct rank (a
    token whose two experts share a rank sends one row there). Each rank is a node (``cfg.n_nodes`` must
    be the world size). The bytes come from the comm log."""
    from shardlib.core.experts.routing import route

    if cfg.n_nodes != ctx.world_size:
        raise ValueError(f"this measurement makes each rank a node: n_nodes must be the world size "
                         f"{ctx.world_size}, got {cfg.n_nodes}")
    n_local = check_ep_degree(cfg, ctx.world_size, ctx.world_size)
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    with torch.no_grad():
        h = project(x[start:stop], weights.w_in)  # (T_r, d_model)
        routing = route(h, weights.router, cfg)
    dest = routing.experts // n_local  # (T_r, k) the rank holding each slot's expert
    slot_token = torch.arange(dest.shape[0]).repeat_interleave(cfg.k)  # (T_r * k,)
    reached = torch.zeros(dest.shape[0], ctx.world_size, dtype=torch.bool).scatter_(1, dest, True)  # (T_r, ep)
    dedup_token, dedup_rank = torch.nonzero(reached, as_tuple=True)  # one row per (token, destination rank)
    slot_rows, slot_wire = _send_rows(ctx, h, slot_token, dest.flatten())
    dedup_rows, dedup_wire = _send_rows(ctx, h, dedup_token, dedup_rank)
    return NodeDispatch(routing.experts, slot_rows, dedup_rows, slot_wire, dedup_wire)


def _send_rows(ctx, h: torch.Tensor, token: torch.Tensor, rank: torch.Tensor) -> tuple[list[int], int]:
    """Send row ``h[token[i]]`` to rank ``rank[i]`` for every ``i`` in one all-to-all; its rows per rank
    and its wire bytes (rows that left this rank) from the comm log."""
    order = torch.sort(rank, stable=True).indices
    to_rank = torch.bincount(rank, minlength=ctx.world_size).tolist()
    from_rank = ctx.comm.exchange_counts(to_rank)
    first = len(ctx.comm.records)
    ctx.comm.all_to_all_single(h[token[order]], to_rank, from_rank)
    return to_rank, ctx.comm.records[first].wire_bytes


PARAMETERS = ("w_in", "router", "gate", "up", "down")


@dataclass(frozen=True)
class MoETrainWeights:
    """Every weight of the toy: the dense input projection, the router, all experts' gated MLPs."""

    w_in: torch.Tensor  # (d_model, d_in), dense: replicated on every rank
    router: torch.Tensor  # (n_experts, d_model), dense
    gate: torch.Tensor  # (n_experts, d_ff, d_model), expert weights: each rank of an ep group holds a block
    up: torch.Tensor  # (n_experts, d_ff, d_model)
    down: torch.Tensor  # (n_experts, d_model, d_ff)

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in PARAMETERS}

    def to(self, dtype: torch.dtype) -> "MoETrainWeights":
        return MoETrainWeights(**{n: t.to(dtype) for n, t in self.as_dict().items()})


def project(x: torch.Tensor, w_in: torch.Tensor) -> torch.Tensor:
    """The dense input projection ``x w_in^T`` on fixed blocks of rows."""
    return blocked_rows(lambda b: F.linear(b, w_in), x, w_in.shape[0])


def task_loss(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """What the model is for: the mean squared error of ``y`` against ``target``."""
    return ((y - target) ** 2).mean()


def group_loss(y: torch.Tensor, target: torch.Tensor, aux_loss: torch.Tensor, cfg: MoEConfig) -> torch.Tensor:
    """One group's loss: ``task_loss``, plus ``aux_loss_coef`` times Switch's loss under ``"aux-loss"``."""
    loss = task_loss(y, target)
    return loss + cfg.aux_loss_coef * aux_loss if cfg.balance == "aux-loss" else loss
