"""Notebook 11's MoE toy trained on ranks, and the same code in one process as its reference.

The toy is a dense input projection ``w_in``, then the training step's MoE layer
(``core.training.moe_block.MoEMLP``, dropless) with its residual, ``y = h + moe(h)`` with ``h = x w_in^T``,
trained by plain SGD to regress a fixed target. The loss is the mean over the token groups (one per rank)
of each group's mean squared error, plus, for ``balance="aux-loss"``, ``aux_loss_coef`` times Switch's loss
on that group's tokens; ``"aux-free"`` moves DeepSeek-V3's bias after each step by the step's counts.

``train_toy`` on a rank: the experts spread by ``placement.layout_expert_groups`` on ``Layout(dp=world,
ep=ep)``. The dense weights (``w_in``, the router) sit on every rank: their gradients are summed over **every rank**. An
expert sits on one place of each ep group; the combine's backward already brings it the gradient of every
row its group sent it, so its gradient is summed over the **edp group** only (Megatron-Core's
``expert_data_parallel``; nothing to sum when ``ep = world``). ``train_toy(None, ...)`` runs the same code
on every group in turn, every expert here, the gradients summed by autograd: the reference, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.checks import number_at_least, positive_number, whole_number
from shardlib.core.experts.balance import bias_update
from shardlib.core.experts.dispatch import EXPERT_KEYS, MoEWeights, make_moe_weights
from shardlib.core.experts.placement import ExpertGroups, layout_expert_groups
from shardlib.core.experts.routing import MoEConfig, blocked_rows
from shardlib.core.mesh import Layout
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.toy import generator, weight
from shardlib.core.training.moe_block import MoEMLP
from shardlib.lab.experts.drivers import token_groups
from shardlib.lab.harness import Measured, on_ranks

EXPERT_PARAMETERS = ("gate", "up", "down")
PARAMETERS = ("w_in", "router", *EXPERT_PARAMETERS)
EXACT_RTOL = 1e-12  # float64: the gradients' sums are reordered across ranks, nothing else differs


@dataclass(frozen=True)
class MoETrainWeights(MoEWeights):
    """Every weight of the toy: the MoE layer's, and the dense input projection."""

    w_in: torch.Tensor  # (d_model, d_in)


@dataclass(frozen=True)
class MoEProblem:
    """Tokens, their targets and the starting weights of a toy regression that trains the layer."""

    x: torch.Tensor  # (T, d_in)
    target: torch.Tensor  # (T, d_model)
    weights: MoETrainWeights


def make_moe_problem(cfg: MoEConfig, n_tokens: int = 64, skew: float = 0.0, seed: int = 0) -> MoEProblem:
    """Reproducible float64 tokens, targets and weights (``d_in = d_model``). The tokens share a mean
    direction ``u``; ``skew`` adds ``skew`` times that direction (through ``w_in``) to router row
    ``cfg.hot_expert``, so most tokens start on that expert: the imbalance that balancing must undo."""
    whole_number(n_tokens, "n_tokens")
    number_at_least(skew, "skew (the hot expert's head start)")
    d_in, g = cfg.d_model, generator(seed)
    u = torch.randn(d_in, generator=g)
    u = u / u.norm()
    x = torch.randn(n_tokens, d_in, generator=g) + 2.0 * u  # (T, d_in)
    teacher = weight(g, cfg.d_model, d_in)
    target = torch.tanh(x @ teacher.T)  # (T, d_model)
    w_in = weight(g, cfg.d_model, d_in)
    moe = make_moe_weights(cfg, g)
    direction = w_in @ u
    moe.router[cfg.hot_expert] += skew * direction / direction.norm()
    weights = MoETrainWeights(*(t.double() for t in (moe.router, moe.gate, moe.up, moe.down, w_in)))
    return MoEProblem(x.double(), target.double(), weights)


def project(x: torch.Tensor, w_in: torch.Tensor) -> torch.Tensor:
    """The dense input projection ``x w_in^T`` on fixed blocks of rows."""
    return blocked_rows(lambda b: F.linear(b, w_in), x, w_in.shape[0])


def check_ep_degree(cfg: MoEConfig, world_size: int, ep: int) -> int:
    """Experts per rank for ``ep`` on ``world_size`` ranks, or a ValueError in the learner's terms."""
    whole_number(ep, "ep (ranks the experts are spread over)")
    if ep > world_size or world_size % ep:
        raise ValueError(f"ep = {ep} on {world_size} ranks: the ranks must form whole expert-parallel groups of ep "
                         f"ranks each, so ep must divide the world size {world_size}")
    return cfg.experts_per_rank(ep)


@dataclass(frozen=True)
class ToyTraining:
    """Steps of the toy: per step the loss and the task loss (means over every group), the token-slots per
    expert over every group ``(n_experts,)`` and the bias chosen with; the last step's summed gradients
    (experts: this rank's block, from ``first_expert``)."""

    losses: tuple[float, ...]
    task_losses: tuple[float, ...]
    counts: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    grads: dict[str, torch.Tensor]
    first_expert: int = 0

    @property
    def max_over_mean(self) -> tuple[float, ...]:
        """Per step, the busiest expert's token-slots over the mean."""
        return tuple(float(c.max() / c.double().mean()) for c in self.counts)


def train_toy(ctx, x: torch.Tensor, target: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig, ep: int = 1,
              steps: int = 1, lr: float = 0.1, n_groups: int = 1) -> ToyTraining:
    """``steps`` SGD steps on the contiguous token groups of ``x`` ``(T, d_in)`` and ``target``
    ``(T, d_model)``: on a rank its own group, experts over ``ep`` ranks; ``ctx=None``: ``n_groups`` groups
    in turn in one process (the module docstring)."""
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    world = whole_number(n_groups, "n_groups") if ctx is None else ctx.world_size
    check_ep_degree(cfg, world, ep)
    groups = (ExpertGroups(None, None, None, 0) if ctx is None else
              layout_expert_groups(ctx, Layout(tp=1, pp=1, dp=world, ep=ep)))
    w = {"router": weights.router, **{k: getattr(weights, n) for k, n in zip(EXPERT_KEYS, EXPERT_PARAMETERS)}}
    moe = MoEMLP(ctx, w, cfg, groups, TPGroup(1, 0), cfg.aux_loss_coef / world)  # Switch's loss weighs coef / world
    w_in = nn.Parameter(weights.w_in.detach().clone())
    params = {"w_in": w_in, "router": moe.router.weight,
              **{n: getattr(moe.experts, k) for n, k in zip(EXPERT_PARAMETERS, EXPERT_KEYS)}}
    shares = list(zip(token_groups(x, world), token_groups(target, world)))  # (T_g, d_in), (T_g, d_model)
    mine = shares if ctx is None else [shares[ctx.rank]]
    out = {"losses": [], "task_losses": [], "counts": [], "biases": []}
    for _ in range(steps):
        out["biases"].append(torch.zeros(cfg.n_experts, dtype=weights.router.dtype) if moe.bias is None else moe.bias)
        for p in params.values():
            p.grad = None
        total = torch.zeros(2, dtype=torch.float64)  # (loss, task loss), means over every group
        for xg, tg in mine:
            h = project(xg, w_in)  # (T_g, d_model)
            task = ((h + moe(h) - tg) ** 2).mean()
            (task / world).backward()  # Switch's loss, if any, joins here through the layer
            aux = moe.aux if cfg.balance == "aux-loss" else torch.zeros((), dtype=h.dtype)
            total += torch.stack([task.detach() + cfg.aux_loss_coef * aux, task.detach()]).to(torch.float64) / world
        counts, moe.step_counts = moe.step_counts, torch.zeros_like(moe.step_counts)
        if ctx is not None:
            for name, p in params.items():
                if name not in EXPERT_PARAMETERS:  # dense: every rank's tokens used them
                    ctx.comm.all_reduce(p.grad)
                elif world > ep:  # experts: the other ep groups' copies
                    ctx.comm.all_reduce(p.grad, group=groups.edp)
        with torch.no_grad():
            for p in params.values():
                p -= lr * p.grad
        if ctx is not None:
            ctx.comm.all_reduce(total)
            ctx.comm.all_reduce(counts)
        if moe.bias is not None:
            moe.bias = bias_update(moe.bias, counts, cfg.bias_rate)
        out["losses"].append(float(total[0]))
        out["task_losses"].append(float(total[1]))
        out["counts"].append(counts)
    return ToyTraining(**{k: tuple(v) for k, v in out.items()}, grads={n: p.grad for n, p in params.items()},
                       first_expert=groups.place * cfg.experts_per_rank(ep))


def relative_error(measured: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |measured - reference| / max |reference|`` (0 when both are 0)."""
    scale = float(reference.abs().max())
    diff = float((measured - reference).abs().max())
    return diff / scale if scale else diff


@dataclass(frozen=True)
class MoETrainingRun:
    """``train_toy`` on ranks (``got``) beside ``reference``, the same in one process. ``trained`` is rank 0's
    steps (its losses, counts and biases are every rank's: each is reduced over every rank) with the last
    step's gradients at full shape: dense ones from rank 0, each block of experts from the rank at its place
    of the first ep group."""

    got: Measured
    trained: ToyTraining
    reference: ToyTraining
    copies_agree: bool  # every copy of a weight holds the same gradient, bit for bit
    counts_exact: bool  # every rank's counts of every step equal the reference's

    @cached_property
    def errors(self) -> dict[str, float]:
        """The worst relative error against the reference: each gradient, the loss and the task loss."""
        out = {n: relative_error(self.trained.grads[n], self.reference.grads[n]) for n in PARAMETERS}
        for key, name in (("loss", "losses"), ("task_loss", "task_losses")):
            out[key] = max(abs(a - b) / abs(b) for a, b in zip(getattr(self.trained, name),
                                                                getattr(self.reference, name)))
        return out

    @property
    def max_error(self) -> float:
        return max(self.errors.values())

    @property
    def exact(self) -> bool:
        """Within ``EXACT_RTOL`` everywhere, the counts equal, the copies agreeing."""
        return self.max_error <= EXACT_RTOL and self.counts_exact and self.copies_agree


def run_moe_training(ranks, problem: MoEProblem, cfg: MoEConfig, ep: int | None = None,
                     steps: int = 1) -> MoETrainingRun:
    """``train_toy`` on every rank (experts over ``ep`` ranks, default every rank), beside ``train_toy`` in
    one process on as many token groups as ranks (run first: it refuses bad input before any rank)."""
    ep = ranks.world_size if ep is None else ep
    args = (problem.x, problem.target, problem.weights, cfg, ep, steps)
    with ranks.same_threads():
        reference = train_toy(None, *args, n_groups=ranks.world_size)
    got = on_ranks(ranks, train_toy, *args)
    each = got.each()
    grads = {n: torch.cat([each[p].grads[n] for p in range(ep)]) if n in EXPERT_PARAMETERS else each[0].grads[n]
             for n in PARAMETERS}
    n_local = cfg.n_experts // ep
    copies_agree = all(torch.equal(t.grads[n], grads[n][t.first_expert:t.first_expert + n_local]
                                   if n in EXPERT_PARAMETERS else grads[n]) for t in each for n in PARAMETERS)
    counts_exact = all(torch.equal(a, b) for t in each for a, b in zip(t.counts, reference.counts))
    return MoETrainingRun(got, replace(each[0], grads=grads), reference, copies_agree, counts_exact)


# The toy trains for tens of steps, not DeepSeek-V3's hundreds of thousands: the published coefficients
# (Switch's alpha 1e-2, DeepSeek-V3's gamma 1e-3) barely move it in that time, so the demo takes ten and
# fifty times as much. Set ``balance`` to ``"aux-loss"`` (Switch's loss times ``aux_loss_coef``) or
# ``"aux-free"`` (DeepSeek-V3's bias moved by ``bias_rate``), from a problem with ``skew=1.0``. The gate is
# DeepSeek-V3's (arXiv:2412.19437 section 2.1.2): sigmoid affinities, the chosen ones normalised, the bias
# added to the affinities for the choice only; both methods run on it, so their loads compare alike.
BALANCE_CONFIG = MoEConfig(d_model=16, d_ff=32, gate="sigmoid-topk", aux_loss_coef=0.1, bias_rate=0.05)
