"""The toy transformer with mixture-of-experts MLPs: its seeded weights and its one-process forward.

Each block is the toy's (``toy.block_reference``) with the MLP replaced by the dropless MoE layer
(``dropless.moe_layer``; Mixtral, Jiang et al. 2024: every block's MLP is ``n_experts`` gated MLPs and a
router): ``h = h + attention(norm h)``, then ``h = h + moe(norm h)`` over the tokens as rows. A layer's
weights are the attention's ``q, k, v, o`` and ``router (E, d)``, ``expert_gate`` and ``expert_up``
``(E, d_ff, d)``, ``expert_down`` ``(E, d, d_ff)``. The serving layouts run the same blocks on ranks
(``core.serving.layouts``). Pure: torch, no ranks.
"""

from __future__ import annotations

import torch

from shardlib.core.config import ModelConfig
from shardlib.core.experts.dropless import moe_layer
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.toy import attention_layer_reference, attention_weights, generator, rms_norm, weight

EXPERT_KEYS = ("expert_gate", "expert_up", "expert_down")


def moe_config(model: ModelConfig, **overrides) -> MoEConfig:
    """The dropless layer's shape for ``model`` (its experts, ``k``, widths; Mixtral's softmax over the
    top-k gate unless overridden)."""
    if not model.is_moe:
        raise ValueError(f"{model.name} is dense (n_experts = {model.n_experts}): it has no experts to route to")
    base = dict(n_experts=model.n_experts, k=model.experts_per_token, d_model=model.d_model, d_ff=model.d_ff)
    return MoEConfig(**{**base, **overrides})


def moe_stack_weights(model: ModelConfig, seed: int = 0) -> list[dict]:
    """Weights of ``model.n_layers`` MoE blocks, drawn in order from one generator seeded with ``seed``:
    attention as ``toy.attention_weights``, router rows of norm 1, experts scaled by ``1/sqrt(fan_in)``."""
    cfg, g = moe_config(model), generator(seed)
    layers = []
    for _ in range(model.n_layers):
        w = attention_weights(g, model)
        router = weight(g, cfg.n_experts, cfg.d_model)
        w["router"] = router / router.norm(dim=1, keepdim=True)
        w["expert_gate"] = torch.stack([weight(g, cfg.d_ff, cfg.d_model) for _ in range(cfg.n_experts)])
        w["expert_up"] = torch.stack([weight(g, cfg.d_ff, cfg.d_model) for _ in range(cfg.n_experts)])
        w["expert_down"] = torch.stack([weight(g, cfg.d_model, cfg.d_ff) for _ in range(cfg.n_experts)])
        layers.append(w)
    return layers


def moe_sublayer_reference(n: torch.Tensor, w: dict, cfg: MoEConfig) -> torch.Tensor:
    """The MoE MLP on ``n`` ``(batch, seq, d_model)`` (already normed): every token a row, no residual."""
    rows = n.reshape(-1, n.shape[-1])  # (batch * seq, d_model)
    y = moe_layer(rows, w["router"], *(w[k] for k in EXPERT_KEYS), cfg).output
    return y.view(n.shape)


def moe_block_reference(h: torch.Tensor, w: dict, model: ModelConfig) -> torch.Tensor:
    """One MoE block, unsharded: ``h + attention(norm h)``, then ``+ moe(norm .)``."""
    h = h + attention_layer_reference(rms_norm(h), w["q"], w["k"], w["v"], w["o"], model.n_heads, model.n_kv_heads)
    return h + moe_sublayer_reference(rms_norm(h), w, moe_config(model))


def moe_stack_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig) -> torch.Tensor:
    """The whole stack of MoE blocks in one process: ``x`` ``(batch, seq, d_model)`` in, the same shape out."""
    for w in layers:
        x = moe_block_reference(x, w, model)
    return x
