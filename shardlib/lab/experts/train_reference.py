"""The MoE training step in one process: what ``train_step.moe_train_on_rank`` on ranks must equal.

The toy model is a dense input projection ``w_in`` then one dropless MoE layer with its residual,
``y = h + moe(h)`` with ``h = x w_in^T``, trained to regress a fixed target. The step's loss is the
mean over the token groups (one group per rank) of each group's mean squared error, plus, for
``balance="aux-loss"``, ``cfg.aux_loss_coef`` times Switch's auxiliary loss on that group's tokens (Switch
computes it per batch a device sees). ``train_steps_reference`` runs plain SGD for several steps, with
DeepSeek-V3's bias update (``balance.bias_update``, counts over every token of the step) for
``balance="aux-free"``. Pure: torch, no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import number_at_least, positive_number, whole_number
from shardlib.core.experts.balance import bias_update, split_groups
from shardlib.core.experts.dispatch import make_moe_weights, moe_layer
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.toy import generator, weight
from shardlib.lab.experts.train_step import EXPERT_PARAMETERS, MoETrainWeights, group_loss, project, task_loss


@dataclass(frozen=True)
class MoEProblem:
    """Tokens, their targets and the starting weights of a toy regression that trains the layer."""

    x: torch.Tensor  # (T, d_in)
    target: torch.Tensor  # (T, d_model)
    weights: MoETrainWeights


def make_moe_problem(cfg: MoEConfig, n_tokens: int = 64, d_in: int | None = None, skew: float = 0.0,
                     hot_expert: int = 0, seed: int = 0, dtype: torch.dtype = torch.float64) -> MoEProblem:
    """Reproducible tokens, targets and weights. The tokens share a mean direction ``u``; ``skew`` adds
    ``skew`` times that direction (through ``w_in``) to router row ``hot_expert``, so most tokens start
    on that expert: the imbalance that balancing must undo."""
    whole_number(n_tokens, "n_tokens")
    d_in = cfg.d_model if d_in is None else whole_number(d_in, "d_in")
    number_at_least(skew, "skew (the hot expert's head start)")
    if not 0 <= hot_expert < cfg.n_experts:
        raise ValueError(f"hot_expert must be an expert id from 0 to {cfg.n_experts - 1}, got {hot_expert!r}")
    g = generator(seed)
    u = torch.randn(d_in, generator=g)
    u = u / u.norm()
    x = torch.randn(n_tokens, d_in, generator=g) + 2.0 * u  # (T, d_in)
    teacher = weight(g, cfg.d_model, d_in)
    target = torch.tanh(x @ teacher.T)  # (T, d_model)
    w_in = weight(g, cfg.d_model, d_in)
    moe = make_moe_weights(cfg, g)
    direction = w_in @ u
    moe.router[hot_expert] += skew * direction / direction.norm()
    weights = MoETrainWeights(moe.router, moe.gate, moe.up, moe.down, w_in).to(dtype)
    return MoEProblem(x.to(dtype), target.to(dtype), weights)


@dataclass(frozen=True)
class ReferenceStep:
    """One step in one process: the loss, every parameter's gradient, the token-slots per expert, and the
    task loss alone (the loss without the auxiliary term)."""

    loss: float
    grads: dict[str, torch.Tensor]  # by PARAMETERS name, full shapes
    counts: torch.Tensor  # (n_experts,) over every token
    task_loss: float = 0.0


def reference_step(x: torch.Tensor, target: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig,
                   n_groups: int, bias: torch.Tensor | None = None) -> ReferenceStep:
    """The loss ``mean_g loss_g`` over ``n_groups`` contiguous token groups and its gradients."""
    params = {n: t.detach().clone().requires_grad_(True) for n, t in weights.as_dict().items()}
    losses, tasks, counts = [], [], torch.zeros(cfg.n_experts, dtype=torch.long)
    for a, b in split_groups(x.shape[0], n_groups):
        h = project(x[a:b], params["w_in"])  # (T_g, d_model)
        layer = moe_layer(h, params["router"], [params[n] for n in EXPERT_PARAMETERS], cfg, bias)
        losses.append(group_loss(h + layer.output, target[a:b], layer.aux_loss, cfg))
        tasks.append(task_loss(h + layer.output, target[a:b]).detach())
        counts += layer.counts
    loss = torch.stack(losses).mean()
    loss.backward()
    return ReferenceStep(float(loss.detach()), {n: p.grad for n, p in params.items()}, counts,
                         float(torch.stack(tasks).mean()))


@dataclass(frozen=True)
class MoEReference:
    """``steps`` SGD steps in one process: per step the loss, the counts and the bias it chose with."""

    losses: tuple[float, ...]
    counts: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    last: ReferenceStep
    weights: MoETrainWeights  # after the last step
    task_losses: tuple[float, ...] = ()


def train_steps_reference(problem: MoEProblem, cfg: MoEConfig, n_groups: int, steps: int = 1,
                          lr: float = 0.1) -> MoEReference:
    """Plain SGD (``w -= lr * grad``) for ``steps`` steps; under ``"aux-free"`` the bias starts at 0 and
    moves by ``balance.bias_update`` after each step."""
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    weights = problem.weights
    bias = torch.zeros(cfg.n_experts, dtype=weights.router.dtype)
    losses, tasks, counts, biases, step = [], [], [], [], None
    for _ in range(steps):
        used = bias if cfg.balance == "aux-free" else None
        step = reference_step(problem.x, problem.target, weights, cfg, n_groups, used)
        losses.append(step.loss)
        tasks.append(step.task_loss)
        counts.append(step.counts)
        biases.append(bias.clone())
        weights = MoETrainWeights(**{n: t - lr * step.grads[n] for n, t in weights.as_dict().items()})
        if cfg.balance == "aux-free":
            bias = bias_update(bias, step.counts, cfg.bias_rate)
    return MoEReference(tuple(losses), tuple(counts), tuple(biases), step, weights, tuple(tasks))
