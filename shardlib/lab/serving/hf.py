"""``transformers`` as the serving engine's peer: a tiny random Llama made here, and a checkpoint read from disk.

Nothing is downloaded. ``random_hf_llama`` is what the engine's tokens are checked against;
``load_llama_checkpoint`` turns a folder with ``config.json`` and ``model.safetensors`` into the engine's weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shardlib.core.model import LlamaWeights, weights_from_hf_llama


def load_llama_checkpoint(folder) -> LlamaWeights:
    """A checkpoint on disk: ``config.json`` and ``model.safetensors`` (nothing is downloaded)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise ValueError(f"{folder} has no {name}: give a folder holding a Llama checkpoint")
    return weights_from_hf_llama(load_file(str(folder / "model.safetensors")),
                                 json.loads((folder / "config.json").read_text()))


def random_hf_llama(seed: int = 0, dtype: torch.dtype = torch.float64, **shape):
    """A tiny ``transformers`` ``LlamaForCausalLM`` with seeded random weights, made here (nothing from a
    hub): the peer the engine's tokens are checked against. ``shape`` overrides the ``transformers`` config."""
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    settings = dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                    rms_norm_eps=1e-6, tie_word_embeddings=False, attn_implementation="sdpa")
    settings.update(shape)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(HFLlamaConfig(**settings)).to(dtype).eval()
    with torch.no_grad():  # a wider spread than the default init, so the argmax is rarely a near-tie
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)
    return model
