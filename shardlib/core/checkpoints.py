"""A ``transformers`` model's weights and config read as the engine's, for each architecture it serves.

``SERVED`` is the registry: per ``model_type``, how a layer's attention and MLP weights are named in the state
dict and what the config adds to Llama's (Mixtral's experts; DeepSeek-V3's latent attention, its dense first
layers, shared experts, sigmoid router with a selection bias and groups). ``weights_from_hf`` reads any of them,
refusing by name what the engine would compute otherwise; ``hf_llama_from_weights`` writes a Llama back. Pure:
torch, no ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from shardlib.core.config import MLAShape, ModelConfig
from shardlib.core.model import LlamaWeights

_HF_LAYER = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
             "attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"}
_HF_MLP = {"gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}  # Llama's dense MLP
_HF_TOP = {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight"}
# LlamaConfig's name of each ModelConfig field: read by ``config_from_hf``, written by ``hf_llama_from_weights``
_HF_CONFIG = {"vocab_size": "vocab_size", "d_model": "hidden_size", "n_layers": "num_hidden_layers",
              "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "d_ff": "intermediate_size",
              "max_positions": "max_position_embeddings", "rope_theta": "rope_theta", "rms_eps": "rms_norm_eps",
              "head_dim": "head_dim"}


# -- the architectures the engine serves, read from transformers ---------------------------------------------
def _llama_attention(state: dict, at: str, config: ModelConfig) -> dict:
    return {k: state[f"{at}{hf}.weight"] for k, hf in _HF_LAYER.items()}  # q, k, v, o (out, in); the norms


def _mla_attention(state: dict, at: str, config: ModelConfig) -> dict:
    """DeepSeek's MLA: the query's two steps and their norm (or one ``q``), the joint down-projection of the
    latent and the shared rotary key, the latent's norm, K and V up, the output; the block's two norms."""
    names = {"kv_a": "kv_a_proj_with_mqa", "kv_a_norm": "kv_a_layernorm", "kv_b": "kv_b_proj", "o": "o_proj",
             **({"q_a": "q_a_proj", "q_a_norm": "q_a_layernorm", "q_b": "q_b_proj"} if config.mla.q_rank
                else {"q": "q_proj"})}
    w = {k: state[f"{at}self_attn.{hf}.weight"] for k, hf in names.items()}
    m, h, d = config.mla, config.n_heads, config.d_model
    shapes = {"q_a": (m.q_rank, d), "q_b": (h * m.qk_dim, m.q_rank), "q": (h * m.qk_dim, d), "kv_a": (m.latent_dim, d),
              "kv_b": (h * (m.nope_dim + m.v_dim), m.kv_rank), "o": (d, h * m.v_dim)}
    for k, shape in shapes.items():
        if k in w and tuple(w[k].shape) != shape:
            raise ValueError(f"{at}self_attn.{names[k]} is {tuple(w[k].shape)} but the config's MLA ranks ({m}, "
                             f"{h} heads, d_model {d}) make it {shape}")
    return {**w, **{k: state[f"{at}{_HF_LAYER[k]}.weight"] for k in ("attn_norm", "mlp_norm")}}


def _llama_mlp(state: dict, at: str, config: ModelConfig, layer: int) -> dict:
    return {k: state[f"{at}{hf}.weight"] for k, hf in _HF_MLP.items()}  # (out, in) each


def _mixtral_mlp(state: dict, at: str, config: ModelConfig, layer: int) -> dict:
    """The router (E, d) and every expert stacked (E, out, in): from ``transformers``' modules (gate and up
    fused in ``gate_up_proj``), or from a checkpoint on disk (Mistral's names: w1 gate, w3 up, w2 down)."""
    if f"{at}mlp.gate.weight" in state:
        gate_up = state[f"{at}mlp.experts.gate_up_proj"]  # (E, 2 expert width, d): the gate's rows, then the up's
        return {"router": state[f"{at}mlp.gate.weight"], "expert_gate": gate_up[:, :config.expert_width],
                "expert_up": gate_up[:, config.expert_width:], "expert_down": state[f"{at}mlp.experts.down_proj"]}
    moe = f"{at}block_sparse_moe."

    def stacked(w: str) -> torch.Tensor:  # (E, out, in)
        return torch.stack([state[f"{moe}experts.{e}.{w}.weight"] for e in range(config.n_experts)])

    return {"router": state[f"{moe}gate.weight"], "expert_gate": stacked("w1"), "expert_up": stacked("w3"),
            "expert_down": stacked("w2")}


def _deepseek_mlp(state: dict, at: str, config: ModelConfig, layer: int) -> dict:
    """A dense MLP in the first ``dense_layers``; then the routed experts, the router's selection bias (its
    auxiliary-loss-free balancing, learned in training, fixed here) and the shared experts."""
    if layer < config.dense_layers:
        return _llama_mlp(state, at, config, layer)
    shared = {k: state[f"{at}mlp.shared_experts.{n}_proj.weight"] for k, n in
              (("shared_gate", "gate"), ("shared_up", "up"), ("shared_down", "down"))}
    return {**_mixtral_mlp(state, at, config, layer), "router_bias": state[f"{at}mlp.gate.e_score_correction_bias"],
            **shared}


def _mixtral_fields(get) -> dict:
    return dict(n_experts=get("num_local_experts"), experts_per_token=get("num_experts_per_tok"),
                router_gate="softmax-then-topk-normalised")


def _deepseek_fields(get) -> dict:
    """DeepSeek-V3's config in ``ModelConfig``'s terms, refusing what the engine would compute otherwise."""
    k, groups, reach = get("num_experts_per_tok"), get("n_group") or 1, get("topk_group") or 1
    if groups > 1 and k != 2 * reach:
        raise ValueError(f"this config routes {k} experts a token within {reach} of {groups} groups: the engine "
                         f"scores a group by its k / topk_group best experts (the report's K_r / M), transformers and "
                         f"DeepSeek's code by its 2 best; they agree only when num_experts_per_tok = 2 x topk_group")
    if not get("norm_topk_prob", True) or get("attention_bias", False):
        raise ValueError("the engine's DeepSeek-V3 normalises its top-k gates and has no attention biases; this config "
                         f"has norm_topk_prob {get('norm_topk_prob')} and attention_bias {get('attention_bias')}")
    mla = MLAShape(kv_rank=get("kv_lora_rank"), rope_dim=get("qk_rope_head_dim"), nope_dim=get("qk_nope_head_dim"),
                   v_dim=get("v_head_dim"), q_rank=get("q_lora_rank") or 0,
                   interleaved=bool(get("rope_interleave", True)))
    return dict(n_experts=get("n_routed_experts"), experts_per_token=k, router_gate="sigmoid-topk", mla=mla,
                n_kv_heads=get("num_attention_heads"), head_dim=mla.qk_dim,
                expert_d_ff=get("moe_intermediate_size"), shared_experts=get("n_shared_experts") or 0,
                dense_layers=get("first_k_dense_replace") or 0, routed_scale=float(get("routed_scaling_factor")),
                expert_groups=groups, node_limit=reach if groups > 1 else 0, router_float32=True)


@dataclass(frozen=True)
class Served:
    """How the engine reads one ``transformers`` architecture: a layer's attention weights and its MLP's from
    the state dict, and the config's fields beyond Llama's."""

    attention: Callable  # (state, "model.layers.i.", config) -> dict
    mlp: Callable  # (state, "model.layers.i.", config, i) -> dict
    fields: Callable  # (get) -> ModelConfig fields


SERVED = {"llama": Served(_llama_attention, _llama_mlp, lambda get: {}),
          "mixtral": Served(_llama_attention, _mixtral_mlp, _mixtral_fields),
          "deepseek_v3": Served(_mla_attention, _deepseek_mlp, _deepseek_fields)}


def config_from_hf(hf_config) -> ModelConfig:
    """The served config from a ``transformers`` ``LlamaConfig``, ``MixtralConfig`` or ``DeepseekV3Config`` (or
    the dict of a ``config.json``; no ``model_type``: Llama): rotary, the norm's epsilon, the norm computed in
    float32, the experts and their router, MLA's ranks."""
    get = hf_config.get if isinstance(hf_config, dict) else lambda k, d=None: getattr(hf_config, k, d)
    arch = str(get("model_type") or "llama")
    if arch not in SERVED:
        raise ValueError(f"the engine serves {', '.join(SERVED)} models ({arch} is not served yet): give the state "
                         "dict and config of a LlamaForCausalLM, a MixtralForCausalLM or a DeepseekV3ForCausalLM")
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
    fields = {k: get(hf) for k, hf in _HF_CONFIG.items()}
    fields.update(n_kv_heads=fields["n_kv_heads"] or fields["n_heads"], head_dim=fields["head_dim"] or 0,
                  rope_theta=float(theta), rms_eps=float(get("rms_norm_eps", 1e-6)))
    fields.update(SERVED[arch].fields(get))
    return ModelConfig(name=arch, norm_float32=True, **fields)


def weights_from_hf(state_dict: dict, hf_config) -> LlamaWeights:
    """The engine's weights from the state dict of a ``transformers`` model it serves (``SERVED``: a
    ``LlamaForCausalLM``, a ``MixtralForCausalLM`` or a ``DeepseekV3ForCausalLM``) and its config."""
    config = config_from_hf(hf_config)
    missing = [v for v in _HF_TOP.values() if v not in state_dict]
    if missing:
        raise ValueError(f"not a {config.name} state dict: {missing} missing")
    served, layers = SERVED[config.name], []
    for i in range(config.n_layers):
        at = f"model.layers.{i}."
        try:
            w = {**served.attention(state_dict, at, config), **served.mlp(state_dict, at, config, i)}
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
