"""Model shapes: ``ModelConfig`` and presets of real public models, from their published configs.

Only shapes (layers, widths, heads, experts, bytes per parameter), never weights: enough to count
parameters and bytes and to decide which splits a model allows. Parameters are counted as in the
Llama/Mixtral architecture (attention ``q, o: d_model x heads * head_dim``, ``k, v`` over the KV heads, a
gated MLP of three ``d_model x d_ff`` matrices per expert, a router, two norms per layer; embedding, final
norm and an untied head). ``quantized(bits)`` stores the layers' matrices as GPTQ/AWQ do (Frantar et al.
2023; Lin et al. 2024): groups of 128 weights with one 16-bit scale, ``bits + 16 / 128`` bits a weight.
What a shape allows (the tensor-parallel rules, KV heads per device, uneven stages) is in
``predict.shapes``. No torch.
"""

from __future__ import annotations

from dataclasses import replace

from shardlib.core.config import MLAShape, ModelConfig

# Facts from each model's published config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size, num_local_experts, num_experts_per_tok). Llama-3.1-405B:
# 405.9 B parameters by this count, "405B" as published.
LLAMA_3_8B = ModelConfig("Llama-3-8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                         vocab_size=128256)
LLAMA_3_70B = ModelConfig("Llama-3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672,
                          vocab_size=128256)
# Llama 3.1 8B and 70B: Llama 3's shapes, with a 128K context (their config.json differ in rope scaling only).
LLAMA_3_1_8B = replace(LLAMA_3_8B, name="Llama-3.1-8B")
LLAMA_3_1_70B = replace(LLAMA_3_70B, name="Llama-3.1-70B")
LLAMA_3_1_405B = ModelConfig("Llama-3.1-405B", n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8,
                             d_ff=53248, vocab_size=128256)
MIXTRAL_8X7B = ModelConfig("Mixtral-8x7B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                           vocab_size=32000, n_experts=8, experts_per_token=2)
# DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, sections 2 and 4.2; its
# published config, deepseek-ai/DeepSeek-V3 config.json / inference/configs/config_671B.json): 61 layers,
# hidden_size 7168, 128 heads (MLA: qk_nope_head_dim 128 + qk_rope_head_dim 64, v_head_dim 128, q_lora_rank
# 1536, kv_lora_rank 512), n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2048,
# n_shared_experts 1, first_k_dense_replace 3 (dense layers of intermediate_size 18432), vocab_size 129280,
# untied head; 671B parameters, 37B active per token (the report's abstract). What this ModelConfig cannot say,
# and how it approximates it:
# * MLA (``MLAShape``): 7168 x 1536 + 1536 x 128 x 192 + 7168 x 576 + 512 x 128 x 256 + 128 x 128 x 7168 =
#   187,105,280 attention weights a layer (q down and up, the joint KV down-projection with the shared RoPE key,
#   k and v up, o); a token caches its compressed latent (512) and its RoPE key (64) per layer, 576 values, not
#   128 keys and values (2 x 128 x 128). n_kv_heads = 128: the heads MLA's up-projection makes, so tp up to 128
#   splits whole heads.
# * Node-limited routing (section 2.1.2): ``node_limit`` 4, each token's experts on at most 4 nodes.
# * The 3 dense first layers count as MoE layers (+32.6B) and the shared expert is left out (-2.6B): 701B by
#   this count, 34.9B active per token (published 671B and 37B). The multi-token-prediction module (14B)
#   is left out too, as the 671B does.
DEEPSEEK_V3 = ModelConfig("DeepSeek-V3", n_layers=61, d_model=7168, n_heads=128, n_kv_heads=128, head_dim=128,
                          d_ff=2048, vocab_size=129280, n_experts=256, experts_per_token=8,
                          mla=MLAShape(kv_rank=512, rope_dim=64, nope_dim=128, v_dim=128, q_rank=1536), node_limit=4)
# DeepSeek-V3 as DeepSeek ships it (the report's section 3.3; the checkpoint's quantization_config: fmt e4m3,
# weight_block_size [128, 128]): every linear layer's weights in FP8 with one float32 scale per 128 x 128 block,
# 4 bytes per 16,384 weights; embeddings, head, norms and router in bf16. ``quantized`` counts a 16-bit scale
# per group, so a group of 8,192 weights gives the same bytes: 1.0002 bytes a weight, 0.70 TB in all.
DEEPSEEK_V3_FP8 = replace(DEEPSEEK_V3.quantized(8, group_size=128 * 128 // 2), name="DeepSeek-V3 FP8")
# Small enough to run for real on a laptop's CPU ranks, shaped like the real ones (GQA, gated MLP).
TOY = ModelConfig("toy", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=256, vocab_size=512,
                  bytes_per_param=4.0)
TOY_MOE = ModelConfig("toy-moe", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=512,
                      n_experts=8, experts_per_token=2, bytes_per_param=4.0)

PRESETS: dict[str, ModelConfig] = {m.name: m for m in (LLAMA_3_8B, LLAMA_3_70B, LLAMA_3_1_405B, MIXTRAL_8X7B, TOY,
                                                        TOY_MOE)}

# Made-up models, each showing a rule other than the KV heads: GPT-2's odd vocabulary (padded, a cost), an MLP
# width of 8,190 that 4 does not divide (a refusal), 30 layers that 4 or 8 stages cut unevenly (a cost).
SHAPE_RULE_EXAMPLES: dict[str, ModelConfig] = {
    "vocab": ModelConfig("odd-vocab-1B", n_layers=24, d_model=2048, n_heads=16, n_kv_heads=8, d_ff=8192,
                         vocab_size=50257),
    "d_ff": ModelConfig("odd-mlp-1B", n_layers=24, d_model=2048, n_heads=16, n_kv_heads=8, d_ff=8190,
                        vocab_size=32000),
    "layers": ModelConfig("30-layer-7B", n_layers=30, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                          vocab_size=32000),
}
