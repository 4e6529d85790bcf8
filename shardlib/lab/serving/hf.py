"""``transformers`` as the serving engine's peer: a tiny random Llama or Mixtral made here, and a checkpoint read
from disk.

Nothing is downloaded. ``random_hf_llama`` and ``random_hf_mixtral`` are what the engine's tokens are checked
against; ``load_llama_checkpoint`` turns a folder with ``config.json`` and ``model.safetensors`` into the engine's
weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shardlib.core.checkpoints import config_from_hf, weights_from_hf
from shardlib.core.config import ModelConfig
from shardlib.core.model import LlamaWeights

SHAPE = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             max_position_embeddings=128, rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="sdpa")

def load_llama_checkpoint(folder) -> LlamaWeights:
    """A Llama or Mixtral checkpoint on disk: ``config.json`` and ``model.safetensors`` (nothing is downloaded)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} has no {name}: give a folder holding a Llama or Mixtral checkpoint")
    return weights_from_hf(load_file(str(folder / "model.safetensors")),
                           json.loads((folder / "config.json").read_text()))


def random_hf_llama(seed: int = 0, dtype: torch.dtype = torch.float64, **shape):
    """A tiny ``transformers`` ``LlamaForCausalLM`` with seeded random weights, made here (nothing from a
    hub): the peer the engine's tokens are checked against. ``shape`` overrides the ``transformers`` config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return _spread(lambda: LlamaForCausalLM(LlamaConfig(**{**SHAPE, "intermediate_size": 64, **shape})), seed, dtype)


def random_hf_mixtral(seed: int = 0, dtype: torch.dtype = torch.float64, **shape):
    """A tiny ``transformers`` ``MixtralForCausalLM`` made here, as ``random_hf_llama``: 4 experts of width 48, 2
    per token. Its experts run one by one (``experts_implementation="eager"``): the grouped kernel refuses
    float64."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(**{**SHAPE, "intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2,
                              **shape})
    return _spread(lambda: MixtralForCausalLM._from_config(config, experts_implementation="eager"), seed, dtype)


# the tiny DeepSeek-V3: 3 layers (the first dense), multi-head latent attention (4 heads; a latent of 12 and a rotary
# key of 4 cached a token a layer; queries through a rank of 16), 8 routed experts of width 24 in 4 groups, 4 a
# token from 2 groups, one shared expert
DEEPSEEK_V3_SHAPE = {**SHAPE, "num_hidden_layers": 3, "num_key_value_heads": 4, "intermediate_size": 48,
                     "moe_intermediate_size": 24, "n_routed_experts": 8, "num_experts_per_tok": 4, "n_group": 4,
                     "topk_group": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "q_lora_rank": 16,
                     "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                     "routed_scaling_factor": 2.5, "rope_interleave": True, "hidden_act": "silu"}


def tiny_deepseek_v3() -> ModelConfig:
    """The tiny DeepSeek-V3's ``ModelConfig``, read from its config as ``transformers`` would give it (no
    ``transformers`` needed): for ``random_weights``."""
    return config_from_hf({"model_type": "deepseek_v3", **DEEPSEEK_V3_SHAPE})


def random_hf_deepseek_v3(seed: int = 0, dtype: torch.dtype = torch.float64, **shape):
    """The tiny DeepSeek-V3 (``DEEPSEEK_V3_SHAPE``) as a ``transformers`` ``DeepseekV3ForCausalLM`` made here, as
    ``random_hf_llama``. The router's selection bias, zero at initialisation, is drawn too, so it changes choices."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(**{**DEEPSEEK_V3_SHAPE, **shape})
    model = _spread(lambda: DeepseekV3ForCausalLM._from_config(config, experts_implementation="eager"), seed, dtype)
    with torch.no_grad():
        for layer in model.model.layers[config.first_k_dense_replace:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return model


def hf_greedy_tokens(model, requests) -> dict:
    """``transformers``' greedy ``generate`` for each request alone (every prompt token real, no end-of-sequence
    stop): request id -> its generated tokens, what the engine's are checked against."""
    out = {}
    with torch.no_grad():
        for r in requests:
            ids = torch.tensor([r.prompt_token_ids])  # the mask says every token is real (0 is also the pad id)
            full = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=r.max_new_tokens,
                                  do_sample=False, eos_token_id=None, pad_token_id=0)
            out[r.request_id] = tuple(full[0, ids.shape[1]:].tolist())
    return out


def _spread(make, seed: int, dtype: torch.dtype):
    """``make()`` from ``seed``, in ``dtype``, every matrix (an expert's too) redrawn with a wider spread than the
    default init, so the argmax is rarely a near-tie."""
    torch.manual_seed(seed)
    model = make().to(dtype).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.3)
    return model
