"""The toy language model in one process: its weights, its loss, and its training run, the reference.

The model is the toy's blocks (``model.block_reference``: pre-norm, causal grouped-query attention and a
gated MLP, no positional encoding) between a token embedding ``embed (V, d)`` and, after a final RMS norm
without scale, an untied LM head ``head (V, d)``; with experts (``config.n_experts > 1``) each MLP is the
dropless MoE layer (``core.experts.dispatch.moe_layer`` on the normed tokens as rows). The loss is the mean
cross-entropy over every token of the global batch, plus, with ``balance="aux-loss"``, Switch's auxiliary
loss per microbatch (``forward``); with ``"aux-free"`` each layer's selection bias moves after each step
(DeepSeek-V3). Weights live in one dict keyed ``embed``, ``layers.{i}.{q,k,v,o,gate,up,down}`` (with
experts ``router`` and ``expert_{gate,up,down}`` for the MLP), ``head``: the ranks' gathered weights use
the same keys. ``train_reference`` runs AdamW (``AdamW``, written out: the same update the ranks run on
their shards) on the batches ``corpus.MarkovCorpus`` draws. Torch only, no ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlib.core.adamw import adamw
from shardlib.core.checks import whole_number
from shardlib.core.experts.balance import bias_update, switch_aux_loss
from shardlib.core.experts.dispatch import layer_experts, moe_layer
from shardlib.core.model import attention_layer_reference, block_reference, rms_norm
from shardlib.core.training.config import TrainingConfig, init_weights, layer_of
from shardlib.core.training.corpus import MarkovCorpus


@dataclass(frozen=True)
class Forward:
    """The model on a batch: per-token losses, and with experts the auxiliary loss (the layers' sum, each the
    mean over the batch's microbatches) and each layer's token-slots per expert."""

    token_losses: torch.Tensor  # (b, s)
    aux_loss: torch.Tensor | None = None  # carries the routers' gradient
    counts: tuple = ()  # per layer: (n_experts,) token-slots


def forward(weights: dict, tokens: torch.Tensor, config: TrainingConfig, biases=None) -> Forward:
    """``tokens (b, s + 1)`` through the model: inputs ``[:, :-1]``, targets ``[:, 1:]`` (``biases``: each MoE
    layer's selection bias, or none)."""
    h = weights["embed"][tokens[:, :-1]]  # (b, s, d)
    aux, counts = None, []
    for i in range(config.n_layers):
        w = layer_of(weights, i)
        if not config.is_moe:
            h = block_reference(h, w, config.model)
            continue
        m = config.model
        h = h + attention_layer_reference(rms_norm(h), w, m)
        n = rms_norm(h)  # (b, s, d)
        out = moe_layer(n.reshape(-1, n.shape[-1]), w["router"], layer_experts(w), config.moe,
                        None if biases is None else biases[i])
        h = h + out.output.view(n.shape)
        counts.append(out.counts)
        per_mb = config.microbatch * config.seq  # a microbatch's tokens: one group of the auxiliary loss
        groups = [switch_aux_loss(e, p) for e, p in zip(out.routing.experts.split(per_mb),
                                                        out.routing.balance_probs.split(per_mb))]
        layer_aux = torch.stack(groups).mean()
        aux = layer_aux if aux is None else aux + layer_aux
    logits = F.linear(rms_norm(h), weights["head"])  # (b, s, V)
    losses = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="none").view(tokens.shape[0], -1)
    return Forward(losses, aux, tuple(counts))


@dataclass(frozen=True)
class TrainingReference:
    """The one-process run: the loss of every step (before its update) and the weights after the last."""

    losses: tuple[float, ...]
    weights: dict
    biases: tuple = ()  # with experts, balance "aux-free": each layer's selection bias after the last step


def train_reference(config: TrainingConfig, dp: int = 1) -> TrainingReference:
    """Train the model in one process on the global batches of ``dp`` replicas (``microbatch x m x dp``
    sequences a step, drawn by ``MarkovCorpus.batch``), AdamW after each step."""
    dp = whole_number(dp, "dp")
    corpus = MarkovCorpus(config)
    weights = {k: v.clone().requires_grad_(True) for k, v in init_weights(config).items()}
    optimizer = adamw(list(weights.values()), config)
    free = config.is_moe and config.balance == "aux-free"
    biases = [torch.zeros(config.n_experts, dtype=config.torch_dtype) for _ in range(config.n_layers)] if free else None
    losses = []
    for step in range(config.steps):
        out = forward(weights, corpus.batch(step, config.global_batch(dp)), config, biases)
        loss = out.token_losses.mean()
        total = loss + config.aux_loss_coef * out.aux_loss if config.is_moe and not free else loss
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if free:  # DeepSeek-V3: each layer's bias moves by the step's counts, after the update
            biases = [bias_update(b, c, config.bias_rate) for b, c in zip(biases, out.counts)]
    return TrainingReference(tuple(losses), {k: v.detach().clone() for k, v in weights.items()}, tuple(biases or ()))
