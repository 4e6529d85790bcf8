"""Notebook 04's MoE toy trained on a pool and set beside one process.

``run_moe_training``: steps of SGD on ranks (``train_step.moe_train_on_rank``), as a ``MoETrainingRun``: the
losses, loads and biases per step, the last step's gradients assembled, each against the one-process
reference in float64. ``run_balance_training``: the same from a skewed router, one balancing method
(Switch's auxiliary loss, DeepSeek-V3's bias, or none).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from shardlib.core.checks import choice, positive_number, whole_number
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.train_reference import MoEProblem, MoEReference, make_moe_problem, train_steps_reference
from shardlib.lab.experts.train_step import EXPERT_PARAMETERS, PARAMETERS, check_ep_degree, moe_train_on_rank
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
