"""The toy language model in one process: its weights, its loss, and its training run, the reference.

The model is the toy's blocks (``toy.block_reference``: pre-norm, causal grouped-query attention and a
gated MLP, no positional encoding, the causal mask alone orders the tokens) between a token embedding
``embed (V, d)`` and, after a final RMS norm without scale, an untied LM head ``head (V, d)``. The loss
is the mean cross-entropy over every token of the global batch. Weights live in one dict keyed
``embed``, ``layers.{i}.{q,k,v,o,gate,up,down}``, ``head``: the ranks' gathered weights use the same
keys. ``train_reference`` runs AdamW (``AdamW``, written out: the same update the ranks run on their shards)
on the batches ``corpus.MarkovCorpus`` draws. Torch only, no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import whole_number
from ..data_parallel.reference import AdamW  # the one AdamW, written out (notebook 08's)
from ..toy import block_reference, generator, rms_norm, stack_weights, weight
from .corpus import MarkovCorpus, TrainingConfig


def init_weights(config: TrainingConfig) -> dict[str, torch.Tensor]:
    """The model's seeded weights, in ``config.dtype``: the blocks from ``toy.stack_weights``, then the
    embedding (unit normal rows) and the head (scaled by ``1/sqrt(d)``) from a second generator."""
    out = {f"layers.{i}.{name}": w for i, layer in enumerate(stack_weights(config.model, config.seed))
           for name, w in layer.items()}
    g = generator(config.seed + 1)
    out["embed"] = torch.randn(config.vocab_size, config.d_model, generator=g)
    out["head"] = weight(g, config.vocab_size, config.d_model)
    return {k: v.to(config.torch_dtype) for k, v in out.items()}


def layer_of(weights: dict, i: int) -> dict[str, torch.Tensor]:
    """Layer ``i``'s weights, by their short names (``q``, ``gate`` ...)."""
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


def token_losses(weights: dict, tokens: torch.Tensor, config: TrainingConfig) -> torch.Tensor:
    """Per-token cross-entropy ``(b, s)`` of ``tokens (b, s + 1)``: inputs ``[:, :-1]``, targets ``[:, 1:]``."""
    h = weights["embed"][tokens[:, :-1]]  # (b, s, d)
    for i in range(config.n_layers):
        h = block_reference(h, layer_of(weights, i), config.model)
    logits = F.linear(rms_norm(h), weights["head"])  # (b, s, V)
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(tokens.shape[0], -1)


def adamw(params, config: TrainingConfig) -> AdamW:
    """AdamW with the run's hyper-parameters (the same arithmetic on a shard as on the whole tensor)."""
    return AdamW(params, lr=config.lr, weight_decay=config.weight_decay)


@dataclass(frozen=True)
class ReferenceRun:
    """The one-process run: the loss of every step (before its update) and the weights after the last."""

    config: TrainingConfig
    dp: int
    losses: tuple[float, ...]
    weights: dict


def train_reference(config: TrainingConfig, dp: int = 1) -> ReferenceRun:
    """Train the model in one process on the global batches of ``dp`` replicas (``microbatch x m x dp``
    sequences a step, drawn by ``MarkovCorpus.batch``), AdamW after each step."""
    dp = whole_number(dp, "dp")
    corpus = MarkovCorpus(config)
    weights = {k: v.clone().requires_grad_(True) for k, v in init_weights(config).items()}
    optimizer = adamw(list(weights.values()), config)
    losses = []
    for step in range(config.steps):
        loss = token_losses(weights, corpus.batch(step, config.global_batch(dp)), config).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return ReferenceRun(config, dp, tuple(losses), {k: v.detach().clone() for k, v in weights.items()})
