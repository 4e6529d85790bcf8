"""The toy every demo runs: ``core.model``'s blocks with no rotary, no norm weights, no embedding or head.

A layer's weights are a dict of ``(out, in)`` matrices (``q, k, v, o``, ``gate, up, down``); a layer may
hold only one part (the pipeline demos use MLP-only layers). Every weight comes from ``weight``: seeded,
scaled by ``1/sqrt(in)``, the same in the notebook and on every rank. ``activations`` are a demo's inputs;
``decode_reference`` is the toy's decode, which has no vocabulary. Pure: torch, no ranks.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import choice, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference

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


# -- the toy's decode ----------------------------------------------------------------------------------
def decode_reference(x: torch.Tensor, layers: list[dict], model: ModelConfig, steps: int) -> torch.Tensor:
    """``steps`` decode steps of the toy in one process: each step's output is the next step's input
    (the toy has no vocabulary: its "next token" is the last output itself). ``x``: (batch, 1, d_model);
    returns (steps, batch, 1, d_model)."""
    outputs = []
    for _ in range(steps):
        x = stack_reference(x, layers, model)
        outputs.append(x)
    return torch.stack(outputs)
