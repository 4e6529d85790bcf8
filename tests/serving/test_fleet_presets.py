"""The KV hand-off for real models: bytes per request worked by hand, the link a rate needs, bad input."""

import pytest

from shardlib.core.config import ModelConfig, kv_bytes_per_token
from shardlib.facts.hardware import ETHERNET_100G, INFINIBAND_400G, NVLINK
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY
from shardlib.predict.serving.presets import (
    REAL_MODELS,
    handoff_need,
    kv_bytes_per_rank,
)
from shardlib.ui.tables import handoff_table


def test_llama_3_70b_by_hand():
    # 2 (K and V) x 80 layers x 8 KV heads x 128 head dim x 2 bytes (bf16) = 327,680 bytes a token
    assert kv_bytes_per_rank(LLAMA_3_70B, 1) == 327_680
    assert kv_bytes_per_rank(LLAMA_3_70B, 1000) == 327_680_000
    # tp = 8: one KV head a rank, an eighth each
    assert kv_bytes_per_rank(LLAMA_3_70B, 1000, tp=8) == 40_960_000
    # tp = 16 passes the 8 KV heads: each rank holds a copy of one, so a rank's share stops shrinking
    assert kv_bytes_per_rank(LLAMA_3_70B, 1000, tp=16) == 40_960_000
    assert handoff_need(LLAMA_3_70B, 1000, 1.0, tp=16).kv_bytes_per_request == 655_360_000


def test_llama_3_8b_and_mixtral_share_a_shape_of_attention():
    # 2 x 32 layers x 8 KV heads x 128 x 2 bytes = 131,072 bytes (128 KiB) a token, for both
    assert kv_bytes_per_rank(LLAMA_3_8B, 1) == 131_072 == kv_bytes_per_rank(MIXTRAL_8X7B, 1)


def test_one_formula_for_the_presets_and_the_engine_llama():
    """The presets' bytes (``predict.shapes.kv_cache_bytes``) and the engine's (``config.kv_bytes_per_token``,
    which the hand-off reads) agree on the same shape, KV heads split or copied."""
    shape = dict(n_layers=3, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=97)
    llama = ModelConfig("llama", vocab_size=97, d_model=64, n_layers=3, n_heads=8, n_kv_heads=4, d_ff=128,
                        max_positions=64, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    for dtype_bytes in (2, 4):
        model = ModelConfig("same-shape", bytes_per_param=float(dtype_bytes), **shape)
        for tp in (1, 2, 4, 8):
            engine = kv_bytes_per_token(llama.n_layers, llama.n_kv_heads, llama.head_dim, dtype_bytes, tp)
            assert kv_bytes_per_rank(model, 10, tp) == engine * 10
    assert kv_bytes_per_rank(TOY, 5) == TOY.kv_bytes_per_token() * 5


def test_kv_bytes_per_rank_is_the_formula():
    # Llama-3-8B-like: 32 layers, 8 KV heads of 128, bf16: 128 KiB a token; tp 2 halves it, tp 16 copies heads
    big = ModelConfig("llama", vocab_size=128256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8, d_ff=14336,
                      max_positions=8192, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    assert kv_bytes_per_rank(big, 1000) == 2 * 32 * 8 * 128 * 2 * 1000
    assert kv_bytes_per_rank(big, 1000, tp=2) == 2 * 32 * 4 * 128 * 2 * 1000
    assert kv_bytes_per_rank(big, 1000, tp=16) == 2 * 32 * 1 * 128 * 2 * 1000
    with pytest.raises(ValueError, match="prompt_tokens"):
        kv_bytes_per_rank(big, 2.5)


def test_the_link_a_rate_needs():
    need = handoff_need(LLAMA_3_70B, 1000, 10.0, tp=8)
    assert need.bytes_per_s == pytest.approx(3.2768e9)  # 327.68 MB a request x 10 a second
    assert need.bytes_per_s_per_rank == pytest.approx(4.096e8)
    assert need.link_share(INFINIBAND_400G) == pytest.approx(4.096e8 / 50e9)
    assert need.link_share(NVLINK) == pytest.approx(4.096e8 / 450e9)  # NVLink's 900 GB/s is both ways
    assert need.handoff_s(ETHERNET_100G) == pytest.approx(40.96e6 / 12.5e9)
    assert need.max_rate_per_s(ETHERNET_100G) == pytest.approx(12.5e9 / 40.96e6)
    assert need.link_share(ETHERNET_100G) < 1 < handoff_need(LLAMA_3_70B, 1000, 400.0, tp=8).link_share(ETHERNET_100G)


def test_the_table_has_a_row_per_real_model():
    text = handoff_table(4096, 10.0)
    assert all(m.name in text for m in REAL_MODELS)
    assert "1342.2" in text  # Llama 3 70B: 327,680 x 4096 bytes


def test_links_inside_a_node_show_only_when_both_pools_fit_one_node():
    apart = handoff_table(4096, 10.0, tp=8)  # 2 x 8 GPUs: two nodes of 8, the hand-off crosses the network
    row = next(line for line in apart.splitlines() if line.startswith("Llama-3-70B")).split()
    assert row[3:5] == ["-", "-"] and row[5:] == ["3.4%", "13.4%"]  # NVLink, PCIe; InfiniBand, Ethernet
    assert "two pools of 8 GPUs need 16, more than a node's 8" in apart
    together = handoff_table(4096, 10.0, tp=4)  # 2 x 4 GPUs: one node
    row = next(line for line in together.splitlines() if line.startswith("Llama-3-70B")).split()
    assert "-" not in row and row[3] == "0.7%" and "-:" not in together


@pytest.mark.parametrize("call, message", [
    (lambda: kv_bytes_per_rank(LLAMA_3_70B, 1000, tp=3), "cannot use tp = 3"),
    (lambda: kv_bytes_per_rank(LLAMA_3_70B, 0), "prompt_tokens"),
    (lambda: kv_bytes_per_rank("Llama-3-70B", 10), "must be a ModelConfig"),
    (lambda: handoff_need(LLAMA_3_70B, 10, 0.0), "rate_per_s"),
])
def test_bad_input_is_refused_in_words(call, message):
    with pytest.raises(ValueError, match=message):
        call()
