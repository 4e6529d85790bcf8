"""Parameter counts from shapes, against the counts the model authors publish."""

import pytest

from shardlib.core.config import ModelConfig
from shardlib.facts.models import (
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    PRESETS,
    SHAPE_RULE_EXAMPLES,
    TOY,
)
from shardlib.predict.shapes import (
    binding_rule,
    kv_cache_bytes,
    kv_head_copies,
    kv_heads_per_device,
    padded_vocab_size,
    pipeline_parallel_problems,
    stage_layers,
    tensor_parallel_problems,
    usable_tensor_parallel_degrees,
    vocab_padding_bytes,
)


@pytest.mark.parametrize("model, published_b, tolerance_b", [
    (LLAMA_3_8B, 8.03, 0.01),     # "8.03B" in the Llama 3 release
    (LLAMA_3_70B, 70.55, 0.06),   # "70.6B"
    (MIXTRAL_8X7B, 46.7, 0.05),   # "46.7B total parameters"
])
def test_parameter_counts_match_published(model, published_b, tolerance_b):
    assert abs(model.n_params / 1e9 - published_b) <= tolerance_b


def test_mixtral_active_parameters():
    assert abs(MIXTRAL_8X7B.active_params_per_token / 1e9 - 12.9) < 0.05  # "12.9B active per token"
    assert LLAMA_3_8B.active_params_per_token == LLAMA_3_8B.n_params


def test_weight_bytes():
    # 70.55e9 parameters x 2 bytes = 141.1e9 bytes: "a 70B model in fp16 is about 140 GB"
    assert LLAMA_3_70B.weight_bytes == LLAMA_3_70B.n_params * 2
    assert 141.0e9 < LLAMA_3_70B.weight_bytes < 141.2e9
    assert TOY.weight_bytes == TOY.n_params * 4


def test_hand_counted_toy():
    # per layer: q,o 2*64*64 = 8192; k,v 2*64*(4*8) = 4096; mlp 3*64*256 = 49152; norms 128 -> 61568
    # embeddings: 2 * 512 * 64 + 64 = 65600; total 4 * 61568 + 65600 = 311872
    assert TOY.head_dim == 8 and TOY.params_per_layer == 61568 and TOY.n_params == 311872


@pytest.mark.parametrize("changes, words", [
    ({"n_kv_heads": 3}, "cannot share 3 KV heads"),
    ({"n_layers": 0}, "n_layers must be a whole number of at least 1"),
    ({"d_model": 60, "n_heads": 8}, "does not divide into 8 heads"),
    ({"n_experts": 2, "experts_per_token": 3}, "cannot use 3 experts when there are only 2"),
    ({"bytes_per_param": 0}, "bytes_per_param must be a positive number, got 0"),
    ({"weight_bits": 3}, "unknown bad: weight_bits 3; use one of 0, 8, 4"),
    ({"quant_group_size": 0}, "quant_group_size must be a whole number of at least 1, got 0"),
])
def test_bad_configs_say_why(changes, words):
    fields = dict(name="bad", n_layers=2, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=100)
    fields.update(changes)
    with pytest.raises(ValueError, match=words):
        ModelConfig(**fields)


def test_presets_are_named_by_their_names():
    assert all(name == m.name for name, m in PRESETS.items())


def test_llama_31_405b_from_its_published_config():
    # per layer: q, o 2 x 16384^2 = 536,870,912; k, v 2 x 16384 x 1024 = 33,554,432; MLP 3 x 16384 x 53248 =
    # 2,617,245,696; norms 32,768: 3,187,703,808 x 126 = 401,650,679,808; embedding and head 2 x 128256 x 16384
    # = 4,202,692,608; final norm 16,384. Sum 405,853,388,800: "405B" as published.
    assert LLAMA_3_1_405B.n_params == 405_853_388_800 and PRESETS["Llama-3.1-405B"] is LLAMA_3_1_405B
    assert LLAMA_3_1_405B.kv_bytes_per_token() == 2 * 126 * 8 * 128 * 2  # 516,096 B per token


def test_uneven_stages_are_allowed_and_only_more_stages_than_layers_is_refused():
    assert pipeline_parallel_problems(LLAMA_3_1_405B, 2) == pipeline_parallel_problems(LLAMA_3_1_405B, 4) == []
    assert pipeline_parallel_problems(LLAMA_3_1_405B, 16) == []  # Llama 3's 16 stages, 126 = 16 x 8 - 2
    assert stage_layers(LLAMA_3_1_405B, 4) == 32 and stage_layers(LLAMA_3_1_405B, 16) == 8
    assert pipeline_parallel_problems(TOY, 5) == ["4 layers cannot fill 5 stages: each stage needs at least one "
                                                  "whole layer"]
    assert pipeline_parallel_problems(TOY, 0)[0].startswith("pp (the number of pipeline stages)")


def test_kv_heads_are_copied_past_their_count_at_a_price():
    # vLLM: tp a multiple of the KV heads, each head on tp / n_kv_heads devices
    assert tensor_parallel_problems(LLAMA_3_70B, 16) == [] and tensor_parallel_problems(MIXTRAL_8X7B, 16) == []
    assert kv_head_copies(LLAMA_3_70B, 16) == 2 and kv_head_copies(LLAMA_3_70B, 8) == 1
    assert kv_heads_per_device(LLAMA_3_70B, 4) == 2 and kv_heads_per_device(LLAMA_3_70B, 16) == 1
    # the cost: the KV cache per GPU stops shrinking at the KV-head count
    per_tp = [kv_cache_bytes(LLAMA_3_70B, 8192, tp=tp) for tp in (1, 2, 4, 8, 16, 32)]
    assert per_tp[:4] == [per_tp[0] / t for t in (1, 2, 4, 8)] and per_tp[3] == per_tp[4] == per_tp[5]
    # truly illegal: 3 and 12 neither divide 8 nor are multiples of it; the message names the rule
    three = tensor_parallel_problems(LLAMA_3_70B, 3)
    assert three[0].startswith("8 KV heads cannot be shared by 3 devices: tp must divide the KV heads")
    assert "or be a multiple of them" in three[0]
    assert "8 KV heads cannot be shared by 12 devices" in tensor_parallel_problems(LLAMA_3_70B, 12)[0]
    # the stricter rule, for code that only splits KV heads
    assert tensor_parallel_problems(LLAMA_3_70B, 16, copy_kv_heads=False)[0].startswith(
        "8 KV heads cannot be split 16 ways")
    assert usable_tensor_parallel_degrees(LLAMA_3_70B) == [1, 2, 4, 8, 16, 32, 64]  # up to the 64 query heads
    assert binding_rule(LLAMA_3_70B, 16) == "" and binding_rule(LLAMA_3_70B, 12) == "kv_heads"
    assert binding_rule(LLAMA_3_70B, 128) == "query_heads"


def test_the_vocabulary_is_padded_never_refused():
    # Megatron-LM pads to a multiple of 128 x tp: 128,256 = 128 x 1,002 is a multiple of 128 x 2, not of 128 x 4
    assert [padded_vocab_size(LLAMA_3_70B, tp) for tp in (1, 2, 4, 8)] == [128256, 128256, 128512, 129024]
    assert vocab_padding_bytes(LLAMA_3_70B, 2) == 0
    assert vocab_padding_bytes(LLAMA_3_70B, 8) == 2 * (129024 - 128256) * 8192 * 2  # embedding + head, bf16
    odd = SHAPE_RULE_EXAMPLES["vocab"]  # GPT-2's 50,257: no tp above 1 divides it
    assert all(tensor_parallel_problems(odd, tp) == [] for tp in (1, 2, 4, 8))
    assert padded_vocab_size(odd, 1) == 50304 and padded_vocab_size(odd, 8) == 51200


def test_the_mlp_width_still_binds():
    model = SHAPE_RULE_EXAMPLES["d_ff"]  # 8,190 = 2 x 4,095
    assert max(usable_tensor_parallel_degrees(model)) == 2
    assert binding_rule(model, 4) == "d_ff" and model.n_kv_heads == 8
    problems = tensor_parallel_problems(model, 4)
    assert len(problems) == 1 and "d_ff = 8190 cannot be split 4 ways" in problems[0]
    layers = SHAPE_RULE_EXAMPLES["layers"]
    assert pipeline_parallel_problems(layers, 4) == [] and stage_layers(layers, 4) == 8  # 8, 8, 7, 7
