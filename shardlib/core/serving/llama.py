"""A Llama-architecture language model to serve: its shape, its weights, and one process running it.

The architecture of Touvron et al. 2023 (Llama 2) as ``transformers``' ``LlamaForCausalLM`` computes it:
a token embedding; per layer an RMSNorm with weights (Zhang and Sennrich 2019), grouped-query attention
(Ainslie et al. 2023) on rotary positions (Su et al. 2021, the rotate-half form), a residual, another
RMSNorm and a SwiGLU MLP (Shazeer 2020), a residual; a final RMSNorm and an untied LM head. The norm and
the rotary angles are computed in float32 and cast back, as ``transformers`` does, so a float64 run
matches its float64 run. ``weights_from_hf_llama`` reads a ``LlamaForCausalLM`` state dict and config;
``load_llama_checkpoint`` a folder with ``config.json`` and ``model.safetensors``. ``greedy_reference``
decodes one prompt by recomputing the whole sequence at every step: slow, plainly right, what the engine
is checked against. Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shardlib.core.checks import positive_number, whole_number
from shardlib.core.config import kv_bytes_per_token
from shardlib.core.toy import mlp_reference, rms_norm

LAYER_KEYS = ("q", "k", "v", "o", "gate", "up", "down", "attn_norm", "mlp_norm")
_HF_LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}


@dataclass(frozen=True)
class LlamaConfig:
    """The model's shape: the fields of a ``LlamaConfig`` that the computation reads."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    max_positions: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    head_dim: int = 0  # 0: d_model / n_heads

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "max_positions"):
            whole_number(getattr(self, name), name)
        positive_number(self.rope_theta, "rope_theta")
        positive_number(self.rms_eps, "rms_eps")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads = {self.n_heads} must be a multiple of n_kv_heads = {self.n_kv_heads}: each "
                             "KV head serves the same number of query heads")
        if not self.head_dim:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model = {self.d_model} does not split into n_heads = {self.n_heads} heads; "
                                 "give head_dim")
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)

    @property
    def group_size(self) -> int:
        """Query heads per KV head."""
        return self.n_heads // self.n_kv_heads

    def kv_bytes_per_token(self, element_bytes: int, tp: int = 1) -> int:
        """K and V of one token in every layer on one rank: ``2 x layers x KV heads per rank x head dim x
        bytes``, the KV heads copied when ``tp`` passes their count (one each)."""
        return int(kv_bytes_per_token(self.n_layers, self.n_kv_heads, self.head_dim, element_bytes, tp))


@dataclass(frozen=True)
class LlamaWeights:
    """The whole model's weights: ``embed`` (V, d), ``norm`` (d,), ``head`` (V, d), and per layer a dict of
    ``LAYER_KEYS`` (the projections as ``(out, in)`` matrices, the norms as vectors)."""

    config: LlamaConfig
    embed: torch.Tensor
    norm: torch.Tensor
    head: torch.Tensor
    layers: tuple[dict, ...] = field(repr=False)

    def __post_init__(self) -> None:
        c = self.config
        if len(self.layers) != c.n_layers:
            raise ValueError(f"the config has {c.n_layers} layers but {len(self.layers)} were given")
        if tuple(self.embed.shape) != (c.vocab_size, c.d_model):
            raise ValueError(f"embed is {tuple(self.embed.shape)}, the config says ({c.vocab_size}, {c.d_model})")

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def to(self, dtype: torch.dtype) -> "LlamaWeights":
        cast = {k: t.to(dtype) for k, t in (("embed", self.embed), ("norm", self.norm), ("head", self.head))}
        return LlamaWeights(self.config, layers=tuple({k: t.to(dtype) for k, t in w.items()} for w in self.layers),
                            **cast)


def config_from_hf(hf_config) -> LlamaConfig:
    """The shape from a ``transformers`` ``LlamaConfig`` (or the dict of a ``config.json``)."""
    get = hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d)
    if get("tie_word_embeddings", False):
        raise ValueError("this model ties its LM head to the embedding; the engine expects an untied head")
    rope = get("rope_scaling") or get("rope_parameters") or {}
    kind = (rope or {}).get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in ("default", None):
        raise ValueError(f"rotary scaling {kind!r} is not implemented; only the default rotary embedding is")
    theta = get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    return LlamaConfig(vocab_size=get("vocab_size"), d_model=get("hidden_size"), n_layers=get("num_hidden_layers"),
                       n_heads=get("num_attention_heads"),
                       n_kv_heads=get("num_key_value_heads") or get("num_attention_heads"),
                       d_ff=get("intermediate_size"), max_positions=get("max_position_embeddings"),
                       rope_theta=float(theta), rms_eps=float(get("rms_norm_eps", 1e-6)),
                       head_dim=get("head_dim") or 0)


def weights_from_hf_llama(state_dict: dict, hf_config) -> LlamaWeights:
    """The engine's weights from a ``LlamaForCausalLM`` state dict and its config."""
    config = config_from_hf(hf_config)
    missing = [k for k in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight") if k not in state_dict]
    if missing:
        raise ValueError(f"not a LlamaForCausalLM state dict: {missing} missing")
    layers = []
    for i in range(config.n_layers):
        keys = {k: f"model.layers.{i}.{hf}.weight" for k, hf in _HF_LAYER.items()}
        absent = [v for v in keys.values() if v not in state_dict]
        if absent:
            raise ValueError(f"layer {i} is incomplete: {absent[:3]} missing")
        layers.append({k: state_dict[v].detach().clone() for k, v in keys.items()})
    return LlamaWeights(config, state_dict["model.embed_tokens.weight"].detach().clone(),
                        state_dict["model.norm.weight"].detach().clone(),
                        state_dict["lm_head.weight"].detach().clone(), tuple(layers))


# -- the computation, shared by the reference and the engine ------------------------------------------
def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding, rotate-half form: ``x`` (tokens, heads, head_dim) at ``positions``."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq  # (tokens, head_dim / 2), float32
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype)[:, None], emb.sin().to(x.dtype)[:, None]  # (tokens, 1, head_dim)
    half = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], dim=-1)
    return x * cos + half * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor) -> torch.Tensor:
    """Causal grouped-query attention of new tokens on a sequence's keys so far.

    ``q`` (new, heads, hd) at ``q_positions``; ``k``, ``v`` (context, kv_heads, hd) for positions
    ``0 .. context - 1``; each query head reads KV head ``head // (heads / kv_heads)``. Returns (new, heads, hd)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (context, heads, hd)
    scores = torch.einsum("nhd,chd->hnc", q, k) * q.shape[-1] ** -0.5  # (heads, new, context)
    visible = torch.arange(k.shape[0])[None, :] <= q_positions[:, None]  # (new, context): causal
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnc,chd->nhd", torch.softmax(scores, dim=-1), v)


def forward_reference(weights: LlamaWeights, token_ids: torch.Tensor) -> torch.Tensor:
    """Logits (tokens, V) of one whole sequence, in one process, with no cache."""
    c = weights.config
    positions = torch.arange(token_ids.shape[0])
    h = weights.embed[token_ids]  # (tokens, d)
    for w in weights.layers:
        x = rms_norm(h, w["attn_norm"], c.rms_eps, torch.float32)
        q = rotary(F.linear(x, w["q"]).view(-1, c.n_heads, c.head_dim), positions, c.rope_theta)
        k = rotary(F.linear(x, w["k"]).view(-1, c.n_kv_heads, c.head_dim), positions, c.rope_theta)
        v = F.linear(x, w["v"]).view(-1, c.n_kv_heads, c.head_dim)
        h = h + F.linear(attend(q, k, v, positions).flatten(1), w["o"])
        h = h + mlp_reference(rms_norm(h, w["mlp_norm"], c.rms_eps, torch.float32), w["gate"], w["up"], w["down"])
    return F.linear(rms_norm(h, weights.norm, c.rms_eps, torch.float32), weights.head)


def greedy_reference(weights: LlamaWeights, prompt_token_ids, max_new_tokens: int) -> tuple[int, ...]:
    """Greedy decoding of one prompt, the whole sequence recomputed at every step."""
    tokens = list(prompt_token_ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            tokens.append(int(forward_reference(weights, torch.tensor(tokens))[-1].argmax()))
    return tuple(tokens[len(prompt_token_ids):])


def random_weights(config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                   scale: float = 0.3) -> LlamaWeights:
    """Seeded random weights of ``config``'s shape, made here (no ``transformers``, nothing downloaded):
    every matrix normal with standard deviation ``scale``, the norms' weights 1."""
    g = torch.Generator().manual_seed(seed)
    c = config

    def matrix(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g, dtype=torch.float64) * scale).to(dtype)

    layers = tuple({"q": matrix(c.n_heads * c.head_dim, c.d_model), "k": matrix(c.n_kv_heads * c.head_dim, c.d_model),
                    "v": matrix(c.n_kv_heads * c.head_dim, c.d_model), "o": matrix(c.d_model, c.n_heads * c.head_dim),
                    "gate": matrix(c.d_ff, c.d_model), "up": matrix(c.d_ff, c.d_model),
                    "down": matrix(c.d_model, c.d_ff), "attn_norm": torch.ones(c.d_model, dtype=dtype),
                    "mlp_norm": torch.ones(c.d_model, dtype=dtype)} for _ in range(c.n_layers))
    return LlamaWeights(c, matrix(c.vocab_size, c.d_model), torch.ones(c.d_model, dtype=dtype),
                        matrix(c.vocab_size, c.d_model), layers)
