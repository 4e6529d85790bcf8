"""Notebook 04's MoE toy on a rank: a dense input projection ``w_in``, then the training step's MoE layer
(``core.training.moe_block.MoEMLP``) with its residual, trained by plain SGD.

The experts are spread by ``core.experts.groups.layout_expert_groups`` on ``Layout(dp=world, ep=ep)``: ep
groups of ``ep`` consecutive ranks, expert-data-parallel (``edp``) groups of the ranks ``ep`` apart.

* **Dense weights** (``w_in``, the router) sit on every rank and every rank's tokens touch them: their
  gradients are summed over **every rank**.
* **Expert weights** sit on one place of each ep group. The combine's backward already brings an expert
  the gradient of every row its ep group sent it; the other ep groups' copies hold the rest, so its
  gradient is summed over the **edp group** (Megatron-Core's ``expert_data_parallel``). With
  ``ep = world`` there is one holder and nothing to sum.

Each rank's loss is divided by ``world`` before its backward, so the sums are the gradients of the mean
over the ``world`` token groups (``train_reference.reference_step``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.experts.balance import bias_update, split_groups
from shardlib.core.experts.dispatch import MoEWeights
from shardlib.core.experts.groups import layout_expert_groups
from shardlib.core.experts.routing import MoEConfig, blocked_rows
from shardlib.core.experts.stack import EXPERT_KEYS
from shardlib.core.mesh import Layout
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.training.moe_block import MoEMLP

EXPERT_PARAMETERS = ("gate", "up", "down")
PARAMETERS = ("w_in", "router", *EXPERT_PARAMETERS)


@dataclass(frozen=True)
class MoETrainWeights(MoEWeights):
    """Every weight of the toy: the MoE layer's (the router and the experts: dense, and a block per rank of an
    ep group), and the dense input projection, replicated on every rank."""

    w_in: torch.Tensor  # (d_model, d_in)

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


def check_ep_degree(cfg: MoEConfig, world_size: int, ep: int) -> int:
    """Experts per rank for ``ep`` on ``world_size`` ranks, or a ValueError in the learner's terms."""
    whole_number(ep, "ep (ranks the experts are spread over)")
    if ep > world_size or world_size % ep:
        raise ValueError(f"ep = {ep} on {world_size} ranks: the ranks must form whole expert-parallel groups of ep "
                         f"ranks each, so ep must divide the world size {world_size}")
    return cfg.experts_per_rank(ep)


class _LayerShape(NamedTuple):
    """What ``MoEMLP`` reads of a training config: one "microbatch" of this rank's ``seq`` tokens."""

    moe: MoEConfig
    microbatch: int
    seq: int
    balance: str


class ToyMoE(nn.Module):
    """The toy on one rank: ``w_in`` whole, then ``MoEMLP`` (the router whole, this rank's block of experts,
    the selection bias, Switch's loss joined to the backward with weight ``aux_loss_coef / world``)."""

    def __init__(self, ctx, weights: MoETrainWeights, cfg: MoEConfig, ep: int, n_tokens: int) -> None:
        super().__init__()
        self.ctx, self.cfg, self.ep = ctx, cfg, ep
        self.groups = layout_expert_groups(ctx, Layout(tp=1, pp=1, dp=ctx.world_size, ep=ep))
        self.w_in = nn.Parameter(weights.w_in.detach().clone())
        w = {"router": weights.router, **{k: getattr(weights, n) for k, n in zip(EXPERT_KEYS, EXPERT_PARAMETERS)}}
        self.moe = MoEMLP(ctx, w, _LayerShape(cfg, 1, n_tokens, cfg.balance), self.groups,
                          TPGroup(1, 0), cfg.aux_loss_coef / ctx.world_size)

    def named_weights(self) -> dict[str, nn.Parameter]:
        experts = self.moe.experts
        return {"w_in": self.w_in, "router": self.moe.router.weight,
                **{n: getattr(experts, k) for n, k in zip(EXPERT_PARAMETERS, EXPERT_KEYS)}}

    def step(self, x: torch.Tensor, target: torch.Tensor, lr: float) -> tuple[torch.Tensor, torch.Tensor]:
        """One SGD step on this rank's ``x`` ``(T_r, d_in)``: (loss, task loss) as means over every rank,
        and the token-slots per expert over every rank ``(n_experts,)``. The reduced gradients stay in
        ``.grad``; the bias moves after the step (DeepSeek-V3)."""
        ctx, cfg, weights = self.ctx, self.cfg, self.named_weights()
        for w in weights.values():
            w.grad = None
        h = project(x, self.w_in)  # (T_r, d_model)
        y = h + self.moe(h)  # (T_r, d_model)
        task = task_loss(y, target)
        (task / ctx.world_size).backward()  # Switch's loss, if any, joins here through the layer
        counts, self.moe.step_counts = self.moe.step_counts, torch.zeros_like(self.moe.step_counts)
        for name, w in weights.items():
            if name not in EXPERT_PARAMETERS:  # dense: every rank's tokens used them
                ctx.comm.all_reduce(w.grad)
            elif ctx.world_size > self.ep:  # experts: the other ep groups' copies
                ctx.comm.all_reduce(w.grad, group=self.groups.edp)
        with torch.no_grad():  # Switch's loss of this rank's tokens, for the loss reported; then SGD
            aux = self.moe.aux if cfg.balance == "aux-loss" else torch.zeros((), dtype=h.dtype)
            for w in weights.values():
                w -= lr * w.grad
        total = torch.stack([task.detach() + cfg.aux_loss_coef * aux, task.detach()]).to(torch.float64)
        total /= ctx.world_size
        ctx.comm.all_reduce(total)  # (loss, task loss), the means over every rank
        ctx.comm.all_reduce(counts)
        if self.moe.bias is not None:
            self.moe.bias = bias_update(self.moe.bias, counts, cfg.bias_rate)
        return total, counts


def moe_train_on_rank(ctx, x: torch.Tensor, target: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig,
                      ep: int, steps: int = 1, lr: float = 0.1) -> dict:
    """``steps`` SGD steps of the toy on this rank's contiguous share of ``x`` ``(T, d_in)`` and ``target``
    ``(T, d_model)``, experts over ``ep`` ranks. Per step the loss and task loss (means over every rank), the
    token-slots per expert and the bias chosen with; the last step's reduced gradients (experts: this
    rank's block, from ``first_expert``)."""
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    n_local = check_ep_degree(cfg, ctx.world_size, ep)
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    model = ToyMoE(ctx, weights, cfg, ep, stop - start)
    out = {"losses": [], "task_losses": [], "counts": [], "biases": []}
    for _ in range(steps):
        bias = model.moe.bias
        out["biases"].append(torch.zeros(cfg.n_experts, dtype=weights.router.dtype) if bias is None else bias)
        (loss, task), counts = model.step(x[start:stop], target[start:stop], lr)
        out["losses"].append(float(loss))
        out["task_losses"].append(float(task))
        out["counts"].append(counts)
    out["grads"] = {n: w.grad for n, w in model.named_weights().items()}
    out["first_expert"] = model.groups.place * n_local
    return out
