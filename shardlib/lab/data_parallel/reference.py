"""Data parallelism's reference: one process training on the whole batch with AdamW, and the input checks.

With the loss the mean squared error over the *global* batch (``global_mse``), the sum of the ranks'
gradients is one process's gradient on the whole batch, so every strategy must end with the weights
``train_one_process`` ends with, within ``core.checks.TOLERANCE``. ``toy_model`` and ``toy_batches``
build what notebook 08 trains. Torch, never ``torch.distributed``.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.adamw import AdamW
from shardlib.core.checks import choice, positive_number, whole_number
from shardlib.core.mesh import DP_STRATEGIES
from shardlib.core.toy import generator, weight


class ResidualMLP(nn.Module):
    """``x + down(gelu(up(x)))``: one block of the toy, ``up (d_hidden, d_model)``, ``down (d_model, d_hidden)``."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))  # (rows, d_model)


def toy_model(d_model: int = 32, d_hidden: int = 64, n_layers: int = 4, d_out: int = 8, seed: int = 0) -> nn.Sequential:
    """``n_layers`` residual MLP blocks and a linear head ``(d_out, d_model)``, seeded weights and biases."""
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


def check_training_inputs(world_size: int, strategy, model, batches, lr, bucket_bytes=None) -> None:
    """A ValueError naming the value, before any rank starts, for anything ``run_data_parallel`` cannot run."""
    choice(strategy, DP_STRATEGIES, "strategy")
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


def train_rows(model: nn.Module, batches, lr: float, dp: int = 1, rank: int = 0, device="cpu") -> tuple[float, ...]:
    """Train ``model`` in place on rank ``rank``'s rows of each batch (every row when ``dp = 1``): the mean
    squared error over those rows, ``AdamW(lr)``. Returns the loss of each step."""
    optimizer = AdamW(model.parameters(), lr=lr)
    losses = []
    for x, y in batches:
        mine = local_rows(x.shape[0], dp, rank)
        loss = F.mse_loss(model(x[mine].to(device)), y[mine].to(device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return tuple(losses)


def train_one_process(model: nn.Module, batches, lr: float) -> dict:
    """The ``state_dict`` of a copy of ``model`` trained on each whole batch in turn (``train_rows``)."""
    check_training_inputs(1, "ddp", model, batches, lr)
    model = copy.deepcopy(model)
    train_rows(model, batches, lr)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def largest_gap(state: dict, reference: dict) -> float:
    """The largest absolute difference between two state dicts (same names and shapes required)."""
    if state.keys() != reference.keys():
        raise ValueError(f"the state dicts name different tensors: {sorted(set(state) ^ set(reference))}")
    return max(float((state[k].float() - reference[k].float()).abs().max()) for k in reference)
