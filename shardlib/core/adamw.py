"""AdamW (Loshchilov and Hutter 2019), written out: the one optimizer every training run here uses."""

from __future__ import annotations

import torch

from shardlib.core.training.config import TrainingConfig


class AdamW:
    """The arithmetic of ``torch.optim.AdamW(foreach=False)`` with its defaults, one tensor at a time, written
    out because a ``torch.optim`` optimizer imports torch's compiler stack (seconds in every fresh process).
    ``state``: per parameter its ``exp_avg`` and ``exp_avg_sq``."""

    def __init__(self, params, lr: float, weight_decay: float = 1e-2, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        self.params, self.lr, self.weight_decay, self.betas, self.eps = list(params), lr, weight_decay, betas, eps
        self.state: dict = {}
        self.steps = 0

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        (beta1, beta2), t = self.betas, self.steps
        for p in self.params:
            if p.grad is None:
                continue
            s = self.state.setdefault(p, {"exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)})
            p.mul_(1 - self.lr * self.weight_decay)  # decoupled weight decay
            s["exp_avg"].lerp_(p.grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g
            s["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)  # v = beta2 v + (1 - beta2) g^2
            denom = (s["exp_avg_sq"].sqrt() / (1 - beta2 ** t) ** 0.5).add_(self.eps)
            p.addcdiv_(s["exp_avg"], denom, value=-self.lr / (1 - beta1 ** t))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def adamw(params, config: TrainingConfig) -> AdamW:
    """AdamW with the run's hyper-parameters (the same arithmetic on a shard as on the whole tensor)."""
    return AdamW(params, lr=config.lr, weight_decay=config.weight_decay)
