"""The MoE training step run on a pool: ``run_moe_training`` (steps of SGD, gathered, set beside the
one-process reference in float64), ``run_balance_training`` (Switch's auxiliary loss against
DeepSeek-V3's auxiliary-loss-free bias over training steps: the loads per expert per step) and
``run_node_limited`` (the cross-node rows of node-limited routing against unlimited, predicted and
measured)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import choice, positive_number, whole_number
from shardlib.core.experts.balance import split_groups
from shardlib.core.experts.node_limited import cross_node_rows, nodes_per_token, tokens_changed
from shardlib.core.experts.routing import MoEConfig, route
from shardlib.lab.experts.train_reference import MoEProblem, MoEReference, make_moe_problem, train_steps_reference
from shardlib.lab.experts.train_step import (
    EXPERT_PARAMETERS,
    PARAMETERS,
    check_ep_degree,
    moe_train_on_rank,
    node_dispatch_on_rank,
    project,
)

EXACT_RTOL = 1e-12  # float64: the gradients' sums are reordered across ranks, nothing else differs


def relative_error(measured: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |measured - reference| / max |reference|`` (0 when both are 0)."""
    scale = float(reference.abs().max())
    diff = float((measured - reference).abs().max())
    return diff / scale if scale else diff


@dataclass(frozen=True)
class MoETrainingRun:
    """``steps`` SGD steps of the MoE toy on ranks, gathered: per step the loss and the token-slots per
    expert (over every rank); the last step's gradients assembled to full shapes (each expert's from the
    ranks holding it, which must agree); the worst relative error of each against the one-process
    reference (``errors``, by parameter name, plus ``"loss"``)."""

    ep: int
    world_size: int
    losses: tuple[float, ...]
    counts: tuple[torch.Tensor, ...]
    biases: tuple[torch.Tensor, ...]
    grads: dict
    errors: dict
    counts_exact: bool  # every step's counts equal the reference's
    copies_agree: bool  # every copy of an expert holds the same gradient, bit for bit
    reference: MoEReference
    task_losses: tuple[float, ...] = ()  # per step, the loss without the auxiliary term

    @property
    def max_error(self) -> float:
        return max(self.errors.values())

    @property
    def exact(self) -> bool:
        """Within ``EXACT_RTOL`` everywhere, the counts equal, the copies agreeing."""
        return self.max_error <= EXACT_RTOL and self.counts_exact and self.copies_agree

    @property
    def max_over_mean(self) -> tuple[float, ...]:
        """Per step, the busiest expert's token-slots over the mean."""
        return tuple(float(c.max() / c.double().mean()) for c in self.counts)


def run_moe_training(ranks, problem: MoEProblem, cfg: MoEConfig, ep: int | None = None, steps: int = 1,
                     lr: float = 0.1) -> MoETrainingRun:
    """``train_step.moe_train_on_rank`` on every rank (experts over ``ep`` ranks, default every rank),
    gathered and compared with ``train_steps_reference`` on as many token groups as ranks."""
    ep = ranks.world_size if ep is None else ep
    n_local = check_ep_degree(cfg, ranks.world_size, ep)
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    if problem.x.shape[0] < ranks.world_size:
        raise ValueError(f"{problem.x.shape[0]} tokens cannot be shared by {ranks.world_size} ranks: each needs one")
    with ranks.same_threads():
        reference = train_steps_reference(problem, cfg, ranks.world_size, steps, lr)
    results = ranks.run(moe_train_on_rank, problem.x, problem.target, problem.weights, cfg, ep, steps, lr)
    first = results[0]
    grads = {n: first.last.grads[n] for n in PARAMETERS if n not in EXPERT_PARAMETERS}
    copies_agree = all(torch.equal(r.last.grads[n], first.last.grads[n]) for r in results for n in grads)
    for name in EXPERT_PARAMETERS:
        blocks = [results[p].last.grads[name] for p in range(ep)]  # places 0 .. ep-1 of the first ep group
        copies_agree &= all(torch.equal(r.last.grads[name], blocks[r.first_expert // n_local]) for r in results)
        grads[name] = torch.cat(blocks)
    errors = {n: relative_error(grads[n], reference.last.grads[n]) for n in PARAMETERS}
    errors["loss"] = max(abs(a - b) / abs(b) for a, b in zip(first.losses, reference.losses))
    errors["task_loss"] = max(abs(a - b) / abs(b) for a, b in zip(first.task_losses, reference.task_losses))
    counts_exact = all(torch.equal(a, b) for r in results for a, b in zip(r.counts, reference.counts))
    return MoETrainingRun(ep, ranks.world_size, tuple(first.losses), tuple(first.counts), tuple(first.biases), grads,
                          errors, counts_exact, copies_agree, reference, tuple(first.task_losses))


# The toy trains for tens of steps, not DeepSeek-V3's hundreds of thousands: the published coefficients
# (Switch's alpha 1e-2, DeepSeek-V3's gamma 1e-3) barely move it in that time, so the demo takes ten and
# fifty times as much.
BALANCE_CONFIG = MoEConfig(d_model=16, d_ff=32, aux_loss_coef=0.1, bias_rate=0.05)


@dataclass(frozen=True)
class BalanceTraining:
    """One balancing method over training steps on ranks: per step the loss (with the auxiliary term
    under ``"aux-loss"``), the task loss alone (what the balancing costs the model), the busiest expert's
    load over the mean, every expert's load and the selection bias; ``exact`` against one process."""

    balance: str
    steps: int
    losses: tuple[float, ...]
    max_over_mean: tuple[float, ...]
    loads: tuple[tuple[int, ...], ...]  # [step][expert] token-slots over every rank
    biases: tuple[tuple[float, ...], ...]  # [step][expert] the selection bias that step chose with
    max_error: float
    exact: bool
    task_losses: tuple[float, ...] = ()


def run_balance_training(ranks, config: MoEConfig = BALANCE_CONFIG, balance: str = "aux-free", steps: int = 20,
                         n_tokens: int = 128, skew: float = 1.0, ep: int | None = None, lr: float = 0.1,
                         seed: int = 0) -> BalanceTraining:
    """Train the toy for ``steps`` steps with one balancing method (``"aux-loss"``: Switch's auxiliary loss
    times ``config.aux_loss_coef``; ``"aux-free"``: DeepSeek-V3's bias moved by ``config.bias_rate``;
    ``"none"``), from weights that send most tokens to expert 0 (``skew``,
    ``train_reference.make_moe_problem``). Returns the loads per expert per step."""
    choice(balance, ("none", "aux-loss", "aux-free"), "balance (how the load is balanced)")
    cfg = config.but(balance=balance)
    problem = make_moe_problem(cfg, n_tokens, skew=skew, seed=seed)
    run = run_moe_training(ranks, problem, cfg, ep, steps, lr)
    return BalanceTraining(balance, steps, run.losses, run.max_over_mean,
                           tuple(tuple(int(v) for v in c) for c in run.counts),
                           tuple(tuple(float(v) for v in b) for b in run.biases), run.max_error, run.exact,
                           run.task_losses)


POLICIES = ("unlimited", "limited")


@dataclass(frozen=True)
class NodeLimitedRun:
    """Unlimited against node-limited routing of the same tokens, each rank an emulated node. Per policy,
    the rows sent off their home node, one per token-slot (``"slots"``) and one per distinct remote node
    (``"dedup"``, DeepSeek-V3's dispatch): ``predicted`` counted from the one-process routing
    (``node_limited.cross_node_rows``), ``measured`` from the ranks' comm logs (wire bytes over the row's
    bytes). ``bound_rows`` is DeepSeek-V3's bound on the dedup rows, ``max_nodes`` per token."""

    n_nodes: int
    max_nodes: int
    n_tokens: int
    row_bytes: int
    predicted: dict  # policy -> {"slots": rows, "dedup": rows}
    measured: dict
    bound_rows: int
    most_nodes_per_token: dict  # policy -> the most nodes any token reached
    tokens_changed: int  # tokens whose top-k differs from unlimited routing: the quality cost

    @property
    def exact(self) -> bool:
        return self.predicted == self.measured

    def cross_node_bytes(self, policy: str, kind: str = "dedup") -> int:
        return self.measured[policy][kind] * self.row_bytes


def run_node_limited(ranks, config: MoEConfig, max_nodes: int = 1, n_tokens: int = 256, seed: int = 0,
                     skew: float = 0.0) -> NodeLimitedRun:
    """Route ``n_tokens`` tokens with ``config`` unlimited and limited to ``max_nodes`` of ``world_size``
    emulated nodes (one per rank); send each policy's rows through real all-to-alls; set the cross-node
    rows measured from the comm logs beside the counts from the one-process routing."""
    n_nodes = ranks.world_size
    limited = config.but(n_nodes=n_nodes, max_nodes=max_nodes)
    cfgs = {"unlimited": config.but(n_nodes=n_nodes, max_nodes=None), "limited": limited}
    check_ep_degree(limited, ranks.world_size, ranks.world_size)
    problem = make_moe_problem(limited, n_tokens, skew=skew, seed=seed)
    home = torch.cat([torch.full((b - a,), r) for r, (a, b) in enumerate(split_groups(n_tokens, n_nodes))])
    row_bytes = limited.d_model * problem.x.element_size()
    predicted, measured, most, chosen = {}, {}, {}, {}
    for policy, cfg in cfgs.items():
        with ranks.same_threads():
            experts = route(project(problem.x, problem.weights.w_in), problem.weights.router, cfg).experts
        chosen[policy] = experts
        predicted[policy] = {kind: cross_node_rows(experts, home, cfg.n_experts, n_nodes, dedup=kind == "dedup")
                             for kind in ("slots", "dedup")}
        got = ranks.run(node_dispatch_on_rank, problem.x, problem.weights, cfg)
        measured[policy] = {"slots": sum(g.slot_wire_bytes for g in got) // row_bytes,
                            "dedup": sum(g.dedup_wire_bytes for g in got) // row_bytes}
        most[policy] = int(nodes_per_token(experts, cfg.n_experts, n_nodes).max())
    return NodeLimitedRun(n_nodes, max_nodes, n_tokens, row_bytes, predicted, measured, n_tokens * max_nodes, most,
                          tokens_changed(chosen["limited"], chosen["unlimited"]))
