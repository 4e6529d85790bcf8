"""Parameter counts from shapes, against the counts the model authors publish."""

import pytest

from shardlib.models import LLAMA_3_70B, LLAMA_3_8B, MIXTRAL_8X7B, PRESETS, TOY, ModelConfig


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
])
def test_bad_configs_say_why(changes, words):
    fields = dict(name="bad", n_layers=2, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=100)
    fields.update(changes)
    with pytest.raises(ValueError, match=words):
        ModelConfig(**fields)


def test_presets_are_named_by_their_names():
    assert all(name == m.name for name, m in PRESETS.items())
