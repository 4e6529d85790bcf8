"""Notebook 04's MoE toy trained on a pool and set beside one process.

* ``run_moe_training``: steps of SGD on ranks (``train_step.moe_train_on_rank``), as a ``MoETrainingRun``:
  the losses, loads and biases per step, the last step's gradients assembled, each against the one-process
  reference in float64. ``run_balance_training``: the same from a skewed router, one balancing method
  (Switch's auxiliary loss, DeepSeek-V3's bias, or none).
* ``run_node_limited``: the cross-node rows of node-limited routing against unlimited, counted from the
  one-process routing and measured from the comm logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
from shardlib.lab.harness import Measured, on_ranks

EXACT_RTOL = 1e-12  # float64: the gradients' sums are reordered across ranks, nothing else differs


def relative_error(measured: torch.Tensor, reference: torch.Tensor) -> float:
    """``max |measured - reference| / max |reference|`` (0 when both are 0)."""
    scale = float(reference.abs().max())
    diff = float((measured - reference).abs().max())
    return diff / scale if scale else diff


def _relative(got, want) -> float:
    return max(abs(a - b) / abs(b) for a, b in zip(got, want))


@dataclass(frozen=True)
class MoETrainingRun:
    """``steps`` SGD steps of the toy on ranks (``got``: what ``on_ranks`` gathered), beside ``reference``.
    The losses, counts and biases are every rank's alike (each reduced over every rank): rank 0's."""

    got: Measured
    cfg: MoEConfig
    ep: int
    reference: MoEReference

    world_size = property(lambda self: len(self.got))
    balance = property(lambda self: self.cfg.balance)
    steps = property(lambda self: len(self.losses))
    losses = property(lambda self: tuple(self.got.first("losses")))  # per step, the auxiliary term included
    task_losses = property(lambda self: tuple(self.got.first("task_losses")))  # per step, without it
    counts = property(lambda self: tuple(self.got.first("counts")))  # per step (n_experts,) over every rank
    biases = property(lambda self: tuple(self.got.first("biases")))  # per step, the bias it chose with

    @property
    def loads(self) -> tuple[tuple[int, ...], ...]:
        """[step][expert] token-slots over every rank."""
        return tuple(tuple(int(v) for v in c) for c in self.counts)

    @cached_property
    def grads(self) -> dict[str, torch.Tensor]:
        """The last step's gradients, full shapes: dense ones from rank 0, each block of experts from the
        rank at its place of the first ep group."""
        grads = self.got.each("grads")
        out = {n: grads[0][n] for n in PARAMETERS if n not in EXPERT_PARAMETERS}
        out.update({n: torch.cat([grads[p][n] for p in range(self.ep)]) for n in EXPERT_PARAMETERS})
        return out

    @property
    def copies_agree(self) -> bool:
        """Every copy of a weight holds the same gradient, bit for bit."""
        n_local = self.cfg.n_experts // self.ep
        return all(torch.equal(g[n], self.grads[n] if n not in EXPERT_PARAMETERS else
                               self.grads[n][first:first + n_local])
                   for g, first in zip(self.got.each("grads"), self.got.each("first_expert")) for n in PARAMETERS)

    @property
    def counts_exact(self) -> bool:
        """Every rank's counts of every step equal the reference's."""
        want = self.reference.counts
        return all(torch.equal(a, b) for counts in self.got.each("counts") for a, b in zip(counts, want))

    @cached_property
    def errors(self) -> dict[str, float]:
        """The worst relative error against the reference: each gradient, the loss and the task loss."""
        out = {n: relative_error(self.grads[n], self.reference.last.grads[n]) for n in PARAMETERS}
        out["loss"] = _relative(self.losses, self.reference.losses)
        out["task_loss"] = _relative(self.task_losses, self.reference.task_losses)
        return out

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
    """``train_step.moe_train_on_rank`` on every rank (experts over ``ep`` ranks, default every rank), beside
    ``train_steps_reference`` on as many token groups as ranks."""
    ep = ranks.world_size if ep is None else ep
    check_ep_degree(cfg, ranks.world_size, ep)
    whole_number(steps, "steps")
    positive_number(lr, "lr (the learning rate)")
    if problem.x.shape[0] < ranks.world_size:
        raise ValueError(f"{problem.x.shape[0]} tokens cannot be shared by {ranks.world_size} ranks: each needs one")
    with ranks.same_threads():
        reference = train_steps_reference(problem, cfg, ranks.world_size, steps, lr)
    got = on_ranks(ranks, moe_train_on_rank, problem.x, problem.target, problem.weights, cfg, ep, steps, lr)
    return MoETrainingRun(got, cfg, ep, reference)


# The toy trains for tens of steps, not DeepSeek-V3's hundreds of thousands: the published coefficients
# (Switch's alpha 1e-2, DeepSeek-V3's gamma 1e-3) barely move it in that time, so the demo takes ten and
# fifty times as much.
BALANCE_CONFIG = MoEConfig(d_model=16, d_ff=32, aux_loss_coef=0.1, bias_rate=0.05)


def run_balance_training(ranks, config: MoEConfig = BALANCE_CONFIG, balance: str = "aux-free", steps: int = 20,
                         n_tokens: int = 128, skew: float = 1.0, ep: int | None = None, lr: float = 0.1,
                         seed: int = 0) -> MoETrainingRun:
    """Train the toy ``steps`` steps with one balancing method (``"aux-loss"``: Switch's auxiliary loss
    times ``config.aux_loss_coef``; ``"aux-free"``: DeepSeek-V3's bias moved by ``config.bias_rate``;
    ``"none"``), from weights that send most tokens to expert 0 (``skew``, ``make_moe_problem``)."""
    choice(balance, ("none", "aux-loss", "aux-free"), "balance (how the load is balanced)")
    cfg = config.but(balance=balance)
    return run_moe_training(ranks, make_moe_problem(cfg, n_tokens, skew=skew, seed=seed), cfg, ep, steps, lr)


@dataclass(frozen=True)
class NodeLimitedRun:
    """Unlimited against node-limited routing of the same tokens, each rank an emulated node. Per policy,
    the rows sent off their home node, one per token-slot (``"slots"``) and one per distinct remote node
    (``"dedup"``, DeepSeek-V3's dispatch): ``predicted`` from the one-process routing
    (``node_limited.cross_node_rows``), ``measured`` from the comm logs (wire bytes over the row's bytes).
    ``bound_rows`` is DeepSeek-V3's bound on the dedup rows, ``max_nodes`` per token."""

    n_nodes: int
    max_nodes: int
    n_tokens: int
    row_bytes: int
    predicted: dict  # policy -> {"slots": rows, "dedup": rows}
    measured: dict
    most_nodes_per_token: dict  # policy -> the most nodes any token reached
    tokens_changed: int  # tokens whose top-k differs from unlimited routing: the quality cost

    bound_rows = property(lambda self: self.n_tokens * self.max_nodes)

    @property
    def exact(self) -> bool:
        return self.predicted == self.measured

    def cross_node_bytes(self, policy: str, kind: str = "dedup") -> int:
        return self.measured[policy][kind] * self.row_bytes


def _rows_sent(got: Measured, which: int, row_bytes: int) -> int:
    """Rows every rank sent to other ranks in its ``which``-th dispatch (0 per slot, 1 deduplicated)."""
    return sum(got.records("all_to_all_single", rank)[2 * which + 1].wire_bytes for rank in got.ranks) // row_bytes


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
            chosen[policy] = experts = route(project(problem.x, problem.weights.w_in), problem.weights.router,
                                             cfg).experts  # (T, k)
        predicted[policy] = {kind: cross_node_rows(experts, home, cfg.n_experts, n_nodes, dedup=kind == "dedup")
                             for kind in ("slots", "dedup")}
        got = on_ranks(ranks, node_dispatch_on_rank, problem.x, problem.weights, cfg)
        measured[policy] = {"slots": _rows_sent(got, 0, row_bytes), "dedup": _rows_sent(got, 1, row_bytes)}
        most[policy] = int(nodes_per_token(experts, cfg.n_experts, n_nodes).max())
    return NodeLimitedRun(n_nodes, max_nodes, n_tokens, row_bytes, predicted, measured, most,
                          tokens_changed(chosen["limited"], chosen["unlimited"]))
