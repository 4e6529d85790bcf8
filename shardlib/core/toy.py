"""The small transformer every demo runs: its reference blocks and its seeded weights.

One block is Llama's, pre-norm and residual: ``h = h + attention(rms_norm(h))`` (causal grouped-query
attention) then ``h = h + mlp(rms_norm(h))`` (gated: ``down(silu(gate(n)) * up(n))``); no learned norm
scale, no embedding or head. A layer's weights are a dict of ``(out, in)`` matrices (``q, k, v, o``,
``gate, up, down``); a layer may hold only one part (the pipeline demos use MLP-only layers). Every weight
comes from ``weight``: seeded, scaled by ``1/sqrt(in)``, the same in the notebook and on every rank.
These are the one-process references every sharded computation is checked against. Pure: torch, no ranks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.checks import choice, whole_number
from shardlib.core.config import ModelConfig

BLOCK_PARTS = ("attention", "mlp")
ATTENTION_WEIGHTS = ("q", "k", "v", "o")
MLP_WEIGHTS = ("gate", "up", "down")


# -- weights ------------------------------------------------------------------------------------------
def generator(seed: int) -> torch.Generator:
    """A CPU random generator seeded with ``seed``: the only source of randomness in the demos."""
    return torch.Generator().manual_seed(whole_number(seed, "seed", 0))


def weight(g: torch.Generator, out_features: int, in_features: int, scale: float = 1.0) -> torch.Tensor:
    """An ``(out_features, in_features)`` normal matrix scaled by ``scale / sqrt(in_features)``."""
    return torch.randn(out_features, in_features, generator=g) * (scale / in_features ** 0.5)


def mlp_weights(g: torch.Generator, d_model: int, d_ff: int) -> dict[str, torch.Tensor]:
    """One gated MLP: ``gate`` and ``up`` ``(d_ff, d_model)``, ``down`` ``(d_model, d_ff)``."""
    return {"gate": weight(g, d_ff, d_model), "up": weight(g, d_ff, d_model), "down": weight(g, d_model, d_ff)}


def attention_weights(g: torch.Generator, model: ModelConfig) -> dict[str, torch.Tensor]:
    """One attention block of ``model``'s shape: ``q (H hd, d)``, ``k, v (KV hd, d)``, ``o (d, H hd)``."""
    d, hd = model.d_model, model.head_dim
    return {"q": weight(g, model.n_heads * hd, d), "k": weight(g, model.n_kv_heads * hd, d),
            "v": weight(g, model.n_kv_heads * hd, d), "o": weight(g, d, model.n_heads * hd)}


def _parts(parts) -> tuple[str, ...]:
    parts = tuple(parts)
    if not parts:
        raise ValueError(f"a layer needs at least one of {BLOCK_PARTS}")
    for p in parts:
        choice(p, BLOCK_PARTS, "block part")
    return parts


def stack_weights(model: ModelConfig, seed: int = 0, parts=BLOCK_PARTS, n_layers: int | None = None) -> list[dict]:
    """Weights of ``n_layers`` blocks (default ``model.n_layers``) of ``model``'s shape, drawn in order
    from one generator seeded with ``seed``. ``parts``: ``("attention", "mlp")``, or one of them."""
    parts = _parts(parts)
    n = model.n_layers if n_layers is None else whole_number(n_layers, "n_layers")
    g = generator(seed)
    layers = []
    for _ in range(n):
        w = attention_weights(g, model) if "attention" in parts else {}
        if "mlp" in parts:
            w.update(mlp_weights(g, model.d_model, model.d_ff))
        layers.append(w)
    return layers


def layer_weights(model: ModelConfig, seed: int = 0, parts=BLOCK_PARTS) -> dict[str, torch.Tensor]:
    """One block's weights: the first layer of ``stack_weights(model, seed, parts)``."""
    return stack_weights(model, seed, parts, n_layers=1)[0]


def activations(batch: int, seq: int, d_model: int, seed: int = 100) -> torch.Tensor:
    """A ``(batch, seq, d_model)`` normal tensor: the input of a demo, or the gradient fed to its output."""
    shape = [whole_number(v, what) for v, what in ((batch, "batch"), (seq, "seq"), (d_model, "d_model"))]
    return torch.randn(*shape, generator=generator(seed))


# -- reference computations ---------------------------------------------------------------------------
def mlp_reference(x: torch.Tensor, w_gate, w_up, w_down) -> torch.Tensor:
    """The gated MLP of Llama and Mixtral experts: ``down(silu(gate(x)) * up(x))``."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(batch, seq, n_heads * head_dim)`` to ``(batch, n_heads, seq, head_dim)``."""
    batch, seq, width = t.shape
    return t.view(batch, seq, n_heads, width // n_heads).transpose(1, 2)


def causal_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``q (b, H, s, hd)`` over ``k, v (b, KV, s, hd)``, each KV head shared by
    ``H / KV`` query heads; returns ``(b, s, H * hd)``."""
    group = q.shape[1] // k.shape[1]  # query heads per KV head
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, H, s, hd)
    return o.transpose(1, 2).flatten(2)


def attention_layer_reference(x: torch.Tensor, wq, wk, wv, wo, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """Causal grouped-query attention on ``x (batch, seq, d_model)``: ``n_heads`` query heads share
    ``n_kv_heads`` KV heads."""
    q = split_heads(F.linear(x, wq), n_heads)  # (b, H, s, hd)
    k, v = split_heads(F.linear(x, wk), n_kv_heads), split_heads(F.linear(x, wv), n_kv_heads)  # (b, KV, s, hd)
    return F.linear(causal_gqa(q, k, v), wo)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | None = None,
             dtype: torch.dtype | None = None) -> torch.Tensor:
    """RMSNorm (Zhang and Sennrich 2019) over the last dim, computed in ``dtype`` (``transformers``' Llama:
    float32; ``None``: ``x``'s) and cast back, then times ``weight`` (``None``: no learned scale, the toy's).
    ``eps``: the computing dtype's machine epsilon unless given."""
    h = x if dtype is None else x.to(dtype)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + (torch.finfo(h.dtype).eps if eps is None else eps))
    return h.to(x.dtype) if weight is None else weight * h.to(x.dtype)


def block_reference(h: torch.Tensor, w: dict, model: ModelConfig) -> torch.Tensor:
    """One block, unsharded: ``h + attention(norm(h))`` if ``w`` has attention weights, then
    ``+ mlp(norm(.))`` if it has MLP weights. Shape kept: (batch, seq, d_model)."""
    if "q" in w:
        h = h + attention_layer_reference(rms_norm(h), w["q"], w["k"], w["v"], w["o"], model.n_heads, model.n_kv_heads)
    if "gate" in w:
        h = h + mlp_reference(rms_norm(h), w["gate"], w["up"], w["down"])
    return h


def stack_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig) -> torch.Tensor:
    """The whole stack of blocks in one process."""
    for w in layers:
        x = block_reference(x, w, model)
    return x


def decode_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig, steps: int) -> torch.Tensor:
    """``steps`` decode steps of the toy in one process: each step's output is the next step's input
    (the toy has no vocabulary: its "next token" is the last output itself). ``x``: (batch, 1, d_model);
    returns (steps, batch, 1, d_model)."""
    outputs = []
    for _ in range(steps):
        x = stack_reference(x, layers, model)
        outputs.append(x)
    return torch.stack(outputs)
