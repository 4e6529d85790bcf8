"""Parameter counts from shapes, against the counts the model authors publish."""

import pytest

from shardlib.models import (
    LLAMA_3_1_405B,
    LLAMA_3_8B,
    LLAMA_3_70B,
    MIXTRAL_8X7B,
    PRESETS,
    SHAPE_RULE_EXAMPLES,
    TOY,
    ModelConfig,
    binding_rule,
    kv_heads_per_device,
    pipeline_parallel_problems,
    tensor_parallel_problems,
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


def test_pipeline_and_copy_rules():
    assert pipeline_parallel_problems(LLAMA_3_1_405B, 2) == []
    assert pipeline_parallel_problems(LLAMA_3_1_405B, 4) == ["126 layers cannot be cut into 4 equal stages "
                                                             "(126 = 4 x 31 + 2)"]
    assert tensor_parallel_problems(LLAMA_3_70B, 16)[0].startswith("8 KV heads cannot be split 16 ways")
    assert tensor_parallel_problems(LLAMA_3_70B, 16, copy_kv_heads=True) == []  # each KV head on 2 GPUs
    assert tensor_parallel_problems(LLAMA_3_70B, 12, copy_kv_heads=True)  # 12 is not a multiple of 8
    assert kv_heads_per_device(LLAMA_3_70B, 4) == 2 and kv_heads_per_device(LLAMA_3_70B, 16) == 1


@pytest.mark.parametrize("rule, largest_tp", [("vocab", 1), ("d_ff", 2), ("layers", 8)])
def test_made_up_models_where_another_rule_binds(rule, largest_tp):
    model = SHAPE_RULE_EXAMPLES[rule]
    assert max(model.usable_tp) == largest_tp
    if rule != "layers":  # the heads would allow 8: the named rule is what stops tp
        assert binding_rule(model, largest_tp * 2) == rule and model.n_kv_heads == 8
        problems = tensor_parallel_problems(model, largest_tp * 2)
        assert len(problems) == 1 and ("vocab" if rule == "vocab" else "d_ff") in problems[0]
    else:
        assert pipeline_parallel_problems(model, 4) and not pipeline_parallel_problems(model, 5)
    assert binding_rule(LLAMA_3_70B, 16) == "kv_heads" and binding_rule(LLAMA_3_70B, 8) == ""
