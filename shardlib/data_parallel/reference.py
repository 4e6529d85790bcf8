"""Data parallelism's reference: one process training on the whole batch with AdamW, and the input checks.

With the loss written as the mean squared error over the *global* batch (``global_mse``), the sum of
the ranks' gradients is one process's gradient on the whole batch, so every strategy must end with the
weights ``train_reference`` ends with, within ``runtime.measure.TOLERANCE`` (the sum runs in another
order). ``toy_model`` and ``toy_batches`` build what notebook 08 trains: residual MLP blocks and a
linear head from the suite's seeded weights; ``parameter_units`` cuts a model into ZeRO-3 units.
Torch, never ``torch.distributed``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import positive_number, whole_number
from ..toy import generator, weight
from .predict import check_strategy


class ResidualMLP(nn.Module):
    """``x + down(gelu(up(x)))``: one block of the toy, ``up (d_hidden, d_model)``, ``down (d_model, d_hidden)``."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))  # (rows, d_model)


def toy_model(d_model: int = 32, d_hidden: int = 64, n_layers: int = 4, d_out: int = 8, seed: int = 0) -> nn.Sequential:
    """``n_layers`` residual MLP blocks and a linear head ``(d_out, d_model)``; weights from ``toy.weight``
    (seeded), biases small and seeded too, so the same seed gives the same model everywhere."""
    dims = [whole_number(v, name) for v, name in ((d_model, "d_model"), (d_hidden, "d_hidden"),
                                                   (n_layers, "n_layers"), (d_out, "d_out"))]
    d_model, d_hidden, n_layers, d_out = dims
    model = nn.Sequential(*[ResidualMLP(d_model, d_hidden) for _ in range(n_layers)], nn.Linear(d_model, d_out))
    g = generator(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(weight(g, module.out_features, module.in_features))
                module.bias.copy_(0.1 * torch.randn(module.out_features, generator=g))
    return model


def toy_batches(n_batches: int, rows: int, d_in: int, d_out: int,
                seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n_batches`` global batches ``(x (rows, d_in), y (rows, d_out))`` of seeded normal values."""
    n_batches, rows = whole_number(n_batches, "n_batches"), whole_number(rows, "rows")
    g = generator(seed)
    return [(torch.randn(rows, d_in, generator=g), torch.randn(rows, d_out, generator=g)) for _ in range(n_batches)]


def local_rows(batch_rows: int, dp: int, rank: int) -> slice:
    """Rank ``rank``'s contiguous share of a global batch of ``batch_rows`` rows."""
    per = batch_rows // dp
    return slice(rank * per, (rank + 1) * per)


def global_mse(output: torch.Tensor, target: torch.Tensor, global_numel: int) -> torch.Tensor:
    """This rank's part of the mean squared error over the global batch (``global_numel`` values)."""
    return ((output - target) ** 2).sum() / global_numel


def parameter_units(model: nn.Module) -> list[tuple[str, list[str]]]:
    """How ZeRO-3 cuts ``model``: the parameters the model holds itself, if any, as a first unit ``""``
    (gathered around the whole forward), then one unit per direct child that holds parameters (gathered
    around the child's forward), in registration order. Each unit is ``(module name, [parameter names])``."""
    units = [(name, [f"{name}.{p}" for p, _ in child.named_parameters()]) for name, child in model.named_children()]
    units = [(name, params) for name, params in units if params]
    own = [name for name, _ in model.named_parameters(recurse=False)]
    return ([("", own)] if own else []) + units


def check_training_inputs(world_size: int, strategy, model, batches, lr, bucket_bytes=None) -> None:
    """A ValueError naming the value, before any rank starts, for anything ``run_data_parallel``
    cannot run: an unknown strategy, a global batch whose rows do not divide among the ranks, a model
    with no parameters, with parameters that are not floating point, frozen, shared or of mixed dtypes,
    or an ``lr`` that is not positive."""
    check_strategy(strategy)
    positive_number(lr, "lr (the learning rate)")
    if bucket_bytes is not None:
        positive_number(bucket_bytes, "bucket_bytes (None for one bucket)")
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be a torch.nn.Module built in this process, got {type(model).__name__}")
    named = list(model.named_parameters(remove_duplicate=False))
    if not named:
        raise ValueError("the model has no parameters to train")
    bad = [f"{n} ({p.dtype})" for n, p in named if not p.is_floating_point()]
    if bad:
        raise ValueError(f"every parameter must be floating point to be trained; not so: {', '.join(bad)}")
    frozen = [n for n, p in named if not p.requires_grad]
    if frozen:
        raise ValueError(f"every parameter must require grad (frozen parameters are not supported): "
                         f"{', '.join(frozen)}")
    if len({id(p) for _, p in named}) != len(named):
        raise ValueError("the model shares a parameter between two places (tied weights): not supported here")
    dtypes = sorted({str(p.dtype) for _, p in named})
    if len(dtypes) > 1:
        raise ValueError(f"the parameters mix dtypes {dtypes}: use one floating dtype for the whole model")
    if not isinstance(batches, (list, tuple)) or not batches:
        raise ValueError("batches must be a non-empty list of (x, y) global batches")
    for i, batch in enumerate(batches):
        pair = isinstance(batch, (list, tuple)) and len(batch) == 2
        if not (pair and all(isinstance(t, torch.Tensor) for t in batch)):
            raise ValueError(f"batch {i} must be a pair of tensors (x, y), got {type(batch).__name__}")
        x, y = batch
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"batch {i}: x has {x.shape[0]} rows but y has {y.shape[0]}")
        if x.shape[0] % world_size:
            raise ValueError(f"batch {i} has {x.shape[0]} rows, which do not divide among {world_size} ranks "
                             f"({x.shape[0]} = {world_size} x {x.shape[0] // world_size} + {x.shape[0] % world_size}): "
                             f"use a multiple of {world_size}")


class AdamW:
    """AdamW (Loshchilov and Hutter 2019) with torch's defaults (betas 0.9 and 0.999, eps 1e-8, weight decay
    0.01), one tensor at a time: decoupled weight decay, then the bias-corrected moments. The arithmetic of
    ``torch.optim.AdamW(foreach=False)``, written out because making a ``torch.optim`` optimizer imports
    torch's compiler stack: seconds of CPU in every fresh process (the kernel and each rank). ``state``:
    per parameter its ``exp_avg`` and ``exp_avg_sq``, what ``runtime.measure.optimizer_state_bytes`` counts."""

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


@dataclass(frozen=True)
class ReferenceRun:
    """One process's training: the trained ``state_dict`` and the loss of each step."""

    state_dict: dict
    losses: tuple[float, ...]


def train_reference(model: nn.Module, batches, lr: float) -> ReferenceRun:
    """Train a copy of ``model`` on each whole batch in turn: mean squared error, ``AdamW(lr)``."""
    check_training_inputs(1, "ddp", model, batches, lr)
    model = copy.deepcopy(model)
    optimizer = AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return ReferenceRun({k: v.detach().clone() for k, v in model.state_dict().items()}, tuple(losses))


def largest_gap(state: dict, reference: dict) -> float:
    """The largest absolute difference between two state dicts (same names and shapes required)."""
    if state.keys() != reference.keys():
        raise ValueError(f"the state dicts name different tensors: {sorted(set(state) ^ set(reference))}")
    return max(float((state[k].float() - reference[k].float()).abs().max()) for k in reference)
