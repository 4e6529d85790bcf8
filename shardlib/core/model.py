"""The transformer: Llama's (Touvron et al. 2023), as one process computes it; every sharded run is checked on it.

A block is pre-norm and residual: ``h + attention(norm(h))`` then ``+ mlp(norm(.))``. RMSNorm (Zhang and
Sennrich 2019) with an optional weight; causal grouped-query attention (Ainslie et al. 2023) on rotary
positions (Su et al. 2021, the rotate-half form); the SwiGLU MLP ``down(silu(gate(x)) * up(x))`` (Shazeer
2020). A layer is a dict of ``(out, in)`` matrices ``q, k, v, o, gate, up, down`` and norm vectors
``attn_norm, mlp_norm``; it may hold only the attention or only the MLP, and no norm weights. Mixtral's (Jiang
et al. 2024) holds a ``router`` and ``expert_gate, expert_up, expert_down`` ``(n_experts, out, in)`` instead of
``gate, up, down``, run by the ``moe`` passed in (``core.experts.dispatch.moe_reference``: the experts sit above
this module). The ``ModelConfig`` says the rest: no rotary when ``rope_theta`` is 0, the norm in float32 when
``norm_float32`` (``transformers``' Llama). Two configs of it run in the course: the toy (``core.toy``: blocks
only, no rotary, no norm weights) and the served Llama or Mixtral (``LlamaWeights``: embedding, blocks, final
norm and head, read from a ``transformers`` state dict by ``weights_from_hf``, a Llama's written back with one
name map, or drawn by ``random_weights``). ``greedy_reference`` recomputes the whole sequence at every token:
slow, plainly right. Pure: torch, no ``torch.distributed``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shardlib.core.config import ModelConfig

_HF_LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_HF_MLP = {"gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}  # Llama's dense MLP
_HF_TOP = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight"}
# LlamaConfig's name of each ModelConfig field: read by ``config_from_hf``, written by ``hf_llama_from_weights``
_HF_CONFIG = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
              "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
              "max_positions": "max_position_embeddings", "rope_theta": "rope_theta", "rms_eps": "rms_norm_eps",
              "head_dim": "head_dim"}


# -- the pieces ---------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 0.0,
             float32: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 if ``float32`` (else in ``x``'s dtype) and cast back,
    then times ``weight`` (``None``: no learned scale). ``eps`` 0: the computing dtype's machine epsilon."""
    h = x.to(torch.float32) if float32 else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + (eps or torch.finfo(h.dtype).eps))
    return h.to(x.dtype) if weight is None else weight * h.to(x.dtype)


def norm(h: torch.Tensor, weight: torch.Tensor | None, model: ModelConfig) -> torch.Tensor:
    """``rms_norm`` as ``model`` computes it (its epsilon, its computing dtype)."""
    return rms_norm(h, weight, model.rms_eps, model.norm_float32)


@functools.lru_cache(maxsize=1)  # every layer of a step rotates at the same positions tensor: one table a step
def rotary_table(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos and sin (seq, dim) of the rotary angles at ``positions``, computed in float32 as ``transformers`` does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq  # (seq, dim / 2)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``x`` (..., heads, seq, head_dim) at ``positions`` (seq,) (``rotary_table``);
    ``theta`` 0: ``x`` itself (no rotary)."""
    if not theta:
        return x
    dim = x.shape[-1]
    cos, sin = rotary_table(positions, dim, theta, x.dtype)  # (seq, head_dim)
    half = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], dim=-1)
    return x * cos + half * sin


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(..., seq, n_heads * head_dim)`` to ``(..., n_heads, seq, head_dim)``."""
    return t.unflatten(-1, (n_heads, -1)).transpose(-3, -2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor | None = None,
              causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """Attention of ``q`` (..., H, new, hd) at ``q_positions`` on ``k, v`` (..., KV, context, hd) at places
    ``0 .. context - 1``; query head ``h`` reads KV head ``h // (H / KV)``. ``q_positions`` ``None``: the
    whole sequence (``new == context``), no mask kept. ``causal=False``: every query reads every key.
    ``scale``: default ``1 / sqrt(hd)``. Returns (..., H, new, hd)."""
    group = q.shape[-3] // k.shape[-3]  # query heads per KV head
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)  # (..., H, context, hd)
    if q_positions is None or not causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    visible = torch.arange(k.shape[-2], device=q.device)[None, :] <= q_positions[:, None]  # (new, context)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def attention_layer_reference(x: torch.Tensor, w: dict, model: ModelConfig,
                              positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
    """Grouped-query attention on ``x`` (..., seq, d_model) with the heads ``w``'s ``q, k, v, o`` hold (all of
    them, or one rank's share: then the output is that rank's share of the sum). ``positions`` (seq,),
    default ``0 .. seq - 1``; ``attend(q, k, v)``, default ``attention``, sees the rotated
    q (..., H, seq, hd) and k, v (..., KV, seq, hd) (a paged cache or a ring may stand in)."""
    hd, theta = model.head_dim, model.rope_theta
    at = torch.arange(x.shape[-2], device=x.device) if positions is None else positions
    q = rotary(split_heads(F.linear(x, w["q"]), w["q"].shape[0] // hd), at, theta)  # (..., H, seq, hd)
    k = rotary(split_heads(F.linear(x, w["k"]), w["k"].shape[0] // hd), at, theta)  # (..., KV, seq, hd)
    v = split_heads(F.linear(x, w["v"]), w["v"].shape[0] // hd)
    o = attention(q, k, v, positions) if attend is None else attend(q, k, v)  # (..., H, seq, hd)
    return F.linear(o.transpose(-3, -2).flatten(-2), w["o"])  # (..., seq, d_model)


def mlp_reference(x: torch.Tensor, w_gate, w_up, w_down) -> torch.Tensor:
    """The gated MLP of Llama and Mixtral experts: ``down(silu(gate(x)) * up(x))``."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def block_reference(h: torch.Tensor, w: dict, model: ModelConfig, positions: torch.Tensor | None = None,
                    moe=None) -> torch.Tensor:
    """One block, unsharded: ``h + attention(norm(h))`` if ``w`` has attention weights, then
    ``+ mlp(norm(.))`` if it has MLP weights, or ``+ moe(norm(.), w, model)`` if it has a router.
    Shape kept: (..., seq, d_model)."""
    if "q" in w:
        h = h + attention_layer_reference(norm(h, w.get("attn_norm"), model), w, model, positions)
    if "gate" in w:
        h = h + mlp_reference(norm(h, w.get("mlp_norm"), model), w["gate"], w["up"], w["down"])
    elif "router" in w:
        if moe is None:
            raise ValueError("this block has experts: pass moe=core.experts.dispatch.moe_reference to run them")
        h = h + moe(norm(h, w.get("mlp_norm"), model), w, model)
    return h


def stack_reference(x: torch.Tensor, layers, model: ModelConfig, positions: torch.Tensor | None = None,
                    moe=None) -> torch.Tensor:
    """The whole stack of blocks in one process (``moe``: as ``block_reference`` takes it)."""
    for w in layers:
        x = block_reference(x, w, model, positions, moe)
    return x


# -- the served model: embedding, blocks, final norm, head ---------------------------------------------
@dataclass(frozen=True)
class LlamaWeights:
    """The whole model's weights: ``embed`` (V, d), ``norm`` (d,), ``head`` (V, d), and per layer a dict of
    ``q, k, v, o, gate, up, down`` (``(out, in)`` matrices) and ``attn_norm, mlp_norm`` (vectors); with experts
    (Mixtral) ``router`` (E, d) and ``expert_gate, expert_up, expert_down`` (E, out, in) for the MLP."""

    config: ModelConfig
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


def forward_reference(weights: LlamaWeights, token_ids: torch.Tensor, moe=None) -> torch.Tensor:
    """Logits (tokens, V) of one whole sequence, in one process, with no cache (``moe``: see
    ``block_reference``)."""
    c = weights.config
    h = stack_reference(weights.embed[token_ids], weights.layers, c, moe=moe)  # (tokens, d)
    return F.linear(norm(h, weights.norm, c), weights.head)


def greedy_reference(weights: LlamaWeights, prompt_token_ids, max_new_tokens: int, moe=None) -> tuple[int, ...]:
    """Greedy decoding of one prompt, the whole sequence recomputed at every step."""
    tokens = list(prompt_token_ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            tokens.append(int(forward_reference(weights, torch.tensor(tokens), moe)[-1].argmax()))
    return tuple(tokens[len(prompt_token_ids):])


# -- the architectures the engine serves, read from transformers ---------------------------------------------
def _llama_mlp(state: dict, at: str, config: ModelConfig) -> dict:
    return {k: state[f"{at}{hf}.weight"] for k, hf in _HF_MLP.items()}  # (out, in) each


def _mixtral_mlp(state: dict, at: str, config: ModelConfig) -> dict:
    """The router (E, d) and every expert stacked (E, out, in): from ``transformers``' modules (gate and up
    fused in ``gate_up_proj``), or from a checkpoint on disk (Mistral's names: w1 gate, w3 up, w2 down)."""
    if f"{at}mlp.gate.weight" in state:
        gate_up = state[f"{at}mlp.experts.gate_up_proj"]  # (E, 2 d_ff, d): the gate's rows, then the up's
        return {"router": state[f"{at}mlp.gate.weight"], "expert_gate": gate_up[:, :config.d_ff],
                "expert_up": gate_up[:, config.d_ff:], "expert_down": state[f"{at}mlp.experts.down_proj"]}
    moe = f"{at}block_sparse_moe."

    def stacked(w: str) -> torch.Tensor:  # (E, out, in)
        return torch.stack([state[f"{moe}experts.{e}.{w}.weight"] for e in range(config.n_experts)])

    return {"router": state[f"{moe}gate.weight"], "expert_gate": stacked("w1"), "expert_up": stacked("w3"),
            "expert_down": stacked("w2")}


# model_type -> (its MLP's weights from a state dict, its config's extra names, its router's gate function)
SERVED = {"llama": (_llama_mlp, {}, "softmax-topk"),
          "mixtral": (_mixtral_mlp, {"n_experts": "num_local_experts", "experts_per_token": "num_experts_per_tok"},
                      "softmax-then-topk-normalised")}


def config_from_hf(hf_config) -> ModelConfig:
    """The served config from a ``transformers`` ``LlamaConfig`` or ``MixtralConfig`` (or the dict of a
    ``config.json``; no ``model_type``: Llama): rotary, the norm's epsilon, the norm computed in float32, the
    experts and their router's gate function."""
    get = hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d)
    arch = str(get("model_type") or "llama")
    if arch not in SERVED:
        raise ValueError(f"the engine serves {' and '.join(SERVED)} models ({arch} is not served yet): give the "
                         "state dict and config of a LlamaForCausalLM or a MixtralForCausalLM")
    window = get("sliding_window")
    if get("hidden_act", "silu") != "silu" or (window and window < (get("max_position_embeddings") or 0)):
        raise ValueError(f"the engine's {arch} has SwiGLU MLPs and full attention; this config has hidden_act "
                         f"{get('hidden_act')!r} and sliding_window {window}")
    if get("tie_word_embeddings", False):
        raise ValueError("this model ties its LM head to the embedding; the engine expects an untied head")
    rope = get("rope_scaling") or get("rope_parameters") or {}
    kind = (rope or {}).get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if kind not in ("default", None):
        raise ValueError(f"rotary scaling {kind!r} is not implemented; only the default rotary embedding is")
    theta = get("rope_theta") or (rope.get("rope_theta") if isinstance(rope, dict) else None) or 10000.0
    _, extra, gate = SERVED[arch]
    fields = {k: get(hf) for k, hf in {**_HF_CONFIG, **extra}.items()}
    fields.update(n_kv_heads=fields["n_kv_heads"] or fields["n_heads"], head_dim=fields["head_dim"] or 0,
                  rope_theta=float(theta), rms_eps=float(get("rms_norm_eps", 1e-6)))
    return ModelConfig(name=arch, norm_float32=True, router_gate=gate, **fields)


def weights_from_hf(state_dict: dict, hf_config) -> LlamaWeights:
    """The engine's weights from the state dict of a ``transformers`` model it serves (``SERVED``: a
    ``LlamaForCausalLM`` or a ``MixtralForCausalLM``) and its config."""
    config = config_from_hf(hf_config)
    missing = [v for v in _HF_TOP.values() if v not in state_dict]
    if missing:
        raise ValueError(f"not a {config.name} state dict: {missing} missing")
    layers = []
    for i in range(config.n_layers):
        at = f"model.layers.{i}."
        try:
            w = {**{k: state_dict[f"{at}{hf}.weight"] for k, hf in _HF_LAYER.items()},
                 **SERVED[config.name][0](state_dict, at, config)}
        except KeyError as absent:
            raise ValueError(f"layer {i} is incomplete: {absent.args[0]!r} missing") from None
        layers.append({k: t.detach().clone() for k, t in w.items()})
    return LlamaWeights(config, layers=tuple(layers), **{k: state_dict[v].detach().clone() for k, v in _HF_TOP.items()})


def weights_from_hf_llama(state_dict: dict, hf_config) -> LlamaWeights:
    """The engine's weights from a ``LlamaForCausalLM`` state dict and its config: ``weights_from_hf``."""
    return weights_from_hf(state_dict, hf_config)


def hf_llama_from_weights(weights: LlamaWeights) -> tuple[dict, dict]:
    """``weights_from_hf_llama``'s inverse: a ``LlamaForCausalLM`` state dict and its config as a dict."""
    if weights.config.is_moe:
        raise ValueError(f"{weights.config.name} has experts: only a dense Llama's weights are written back")
    state = {v: getattr(weights, k) for k, v in _HF_TOP.items()}
    for i, layer in enumerate(weights.layers):
        state.update({f"model.layers.{i}.{hf}.weight": layer[k] for k, hf in {**_HF_LAYER, **_HF_MLP}.items()})
    return state, {hf: getattr(weights.config, k) for k, hf in _HF_CONFIG.items()}


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
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
