"""The toy transformer with mixture-of-experts MLPs: its seeded weights and its one-process forward.

Each block is the toy's with the MLP replaced by the MoE layer (``dispatch.moe_layer``; Mixtral, Jiang et
al. 2024: every block's MLP is ``n_experts`` gated MLPs and a router): ``h = h + attention(norm h)``, then
``h = h + moe(norm h)`` over the tokens as rows. A layer's weights are the attention's ``q, k, v, o`` and
``router (E, d)``, ``expert_gate`` and ``expert_up`` ``(E, d_ff, d)``, ``expert_down`` ``(E, d, d_ff)``. The
serving layouts and the training step run the same blocks on ranks. Pure: torch, no ranks.
"""

from __future__ import annotations

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.experts.dispatch import LocalExperts, make_moe_weights, moe_layer
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.model import attention_layer_reference, rms_norm
from shardlib.core.toy import attention_weights, generator

EXPERT_KEYS = ("expert_gate", "expert_up", "expert_down")


def layer_experts(w: dict, ids: slice | None = None) -> LocalExperts:
    """A layer's experts ``ids`` (default: all) as the MoE layer takes them."""
    return LocalExperts(*(w[k] if ids is None else w[k][ids] for k in EXPERT_KEYS))


def moe_stack_weights(model: ModelConfig, seed: int = 0) -> list[dict]:
    """Weights of ``model.n_layers`` MoE blocks, drawn in order from one generator seeded with ``seed``:
    attention as ``toy.attention_weights``, then the layer's ``dispatch.make_moe_weights``."""
    cfg, g = MoEConfig.from_model(model), generator(seed)
    layers = []
    for _ in range(model.n_layers):
        w, moe = attention_weights(g, model), make_moe_weights(cfg, g)
        layers.append({**w, "router": moe.router, **dict(zip(EXPERT_KEYS, moe.experts()))})
    return layers


def moe_stack_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig) -> torch.Tensor:
    """The whole stack of MoE blocks in one process: ``x`` ``(batch, seq, d_model)`` in, the same shape out."""
    cfg = MoEConfig.from_model(model)
    for w in layers:
        x = x + attention_layer_reference(rms_norm(x), w, model)
        n = rms_norm(x)  # (batch, seq, d_model)
        x = x + moe_layer(n.reshape(-1, n.shape[-1]), w["router"], layer_experts(w), cfg).output.view(n.shape)
    return x
