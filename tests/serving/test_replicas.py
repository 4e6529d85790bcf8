"""GPU facts, what fits where (bf16 and quantised), and replicas against tensor parallelism, by hand."""

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import (
    B200,
    GPU,
    GPU_MEMORY_BYTES,
    GPUS,
    H100_80GB,
    H200,
    INFINITY_FABRIC,
    MI300X,
    MI325X,
    NVLINK_5,
    ONE_H100,
    Link,
    gpu_cluster,
)
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.serving.memory import Workload, fit_on_gpus, gpus_needed
from shardlib.predict.serving.planner import plan_serving
from shardlib.predict.serving.replicas import latency_vs_throughput
from shardlib.ui.tables import format_fit, format_latency_vs_throughput


# -- GPU facts ----------------------------------------------------------------------------------------------
def test_gpu_classes_with_their_sources():
    assert {round(g.memory_bytes / 1e9) for g in GPUS.values()} >= {80, 141, 180, 192, 256}
    assert GPU_MEMORY_BYTES == {name: g.memory_bytes for name, g in GPUS.items()}
    for g in GPUS.values():
        assert len(g.source) > 40 and f"{g.memory_bytes / 1e9:.0f}" in g.source.replace(",", "")
        assert g.memory_bytes_per_s > 1e12 and g.bf16_flops_per_s > 1e14
    assert 8 * B200.memory_bytes == 1440e9 and "1,440 GB" in B200.source  # DGX B200: 1,440 GB across 8 GPUs
    assert B200.node_link is NVLINK_5 and MI300X.node_link is INFINITY_FABRIC is MI325X.node_link
    assert gpu_cluster(MI300X, 2).intra_link is INFINITY_FABRIC  # each GPU's own node link by default
    with pytest.raises(ValueError, match="x: memory_bytes must be a positive number, got 0"):
        GPU("x", 0, 1e12, 1e14, "made up")


# -- what fits ------------------------------------------------------------------------------------------------
def test_70b_in_bf16_on_one_gpu_of_each_class():
    # 141.1 GB of weights: more than 80 GB, and (by 0.1 GB) more than the H200's 141 GB even if a server
    # could fill all of it; the 180-256 GB class holds it, with room for some KV cache.
    assert not fit_on_gpus(LLAMA_3_70B, H100_80GB).fits
    assert not fit_on_gpus(LLAMA_3_70B, H200, memory_utilization=1.0).fits
    # B200: 0.9 x 180 GB = 162 GB usable; 162 - 141.11 = 20.89 GB over 1.34 GB per 4,096-token sequence = 15
    sequences = {g.name: fit_on_gpus(LLAMA_3_70B, g).sequences for g in (B200, MI300X, MI325X)}
    assert sequences == {"B200": 15, "MI300X": 23, "MI325X": 66}
    assert fit_on_gpus(LLAMA_3_70B, B200, context_tokens=32768).sequences == 1  # 10.7 GB each: one long one
    text = format_fit(fit_on_gpus(LLAMA_3_70B, B200))
    assert text == ("Llama-3-70B on one B200: 141.1 GB of weights per GPU leave 20.9 GB of the 162.0 GB a server fills "
                    "of 180.0 GB: room for 15 sequences of 4,096 tokens (1.3 GB of KV cache each)")


def test_how_many_80gb_gpus():
    # two H100s hold 70B's weights (70.6 GB each) with room for two 4K sequences; 64 sequences need four
    assert gpus_needed(LLAMA_3_70B, H100_80GB) == 2
    assert fit_on_gpus(LLAMA_3_70B, H100_80GB, tp=2).sequences == 2
    assert gpus_needed(LLAMA_3_70B, H100_80GB, sequences=64) == 4
    assert gpus_needed(LLAMA_3_8B, H100_80GB) == 1
    # in bf16 405B needs more than one 8 x 80 GB node: tp = 16, its 8 KV heads each copied on 2 GPUs
    assert gpus_needed(LLAMA_3_1_405B, H100_80GB) == 16
    assert gpus_needed(LLAMA_3_1_405B, H100_80GB, max_tp=8) is None
    # in 8 bits (Meta ships an FP8 405B for one 8 x H100 node) one node holds it, 52.1 GB of weights per GPU
    assert gpus_needed(LLAMA_3_1_405B.quantized(8), H100_80GB) == 8


def test_quantised_weights_by_hand():
    # 4-bit, groups of 128 with a 16-bit scale: 0.5 + 2/128 = 0.515625 bytes per matrix weight.
    q4 = LLAMA_3_70B.quantized(4)
    assert q4.matrix_bytes_per_param == 0.515625 and LLAMA_3_70B.quantized(8).matrix_bytes_per_param == 1.015625
    # 80 layers x 855,638,016 matrix weights x 0.515625 = 35,295,068,160 B; norms, embedding, head and the final
    # norm (2,102,665,216 values) stay at 2 bytes: 4,205,330,432 B. Sum 39,500,398,592 B.
    assert q4.weight_bytes == 39_500_398_592
    assert q4.kv_bytes_per_token() == LLAMA_3_70B.kv_bytes_per_token() == 327_680  # the cache keeps its dtype
    assert q4.name == "Llama-3-70B 4-bit"
    # the planner uses it: 70B does not fit one H100 in bf16; in 4 bits it does, with 24 sequences
    assert not plan_serving(LLAMA_3_70B, ONE_H100).ranked
    best = plan_serving(q4, ONE_H100).best
    assert best.layout == Layout(1, 1, 1) and best.batch == fit_on_gpus(q4, H100_80GB).sequences == 24
    with pytest.raises(ValueError, match=r"unknown bits \(quantised weights\) 3; use one of 8, 4"):
        LLAMA_3_70B.quantized(3)


# -- latency against throughput, by hand -----------------------------------------------------------------------
HAND = ModelConfig("hand", n_layers=2, d_model=8, n_heads=2, n_kv_heads=2, d_ff=16, vocab_size=16, bytes_per_param=1.0,
                   vocab_multiple=8)  # padded to 8 x tp = 16 rows at tp <= 2: no padding to count by hand
HAND_LINK = Link("hand link", 1e6, 0.01)  # 1 MB/s each way, 10 ms per call
HAND_GPU = GPU("hand GPU", 2000, 1000, 1e12, "made up: 2 kB, read at 1 kB/s, arithmetic far faster", HAND_LINK)
WHOLE = Workload(context_tokens=4, prompt_tokens=4, memory_utilization=1.0)
# HAND per layer: q, o 2 x 8 x 8 = 128; k, v 2 x 8 x 8 = 128; MLP 3 x 8 x 16 = 384 (1 byte each), norms 16.
# Head 16 x 8 = 128 B. KV cache per sequence: 2 x 2 layers x 2 heads x 4 x 1 B x 4 tokens = 128 B.


def test_replicas_against_tensor_parallel_by_hand():
    points = {p.label: p for p in latency_vs_throughput(HAND, HAND_GPU, degrees=(2,), workload=WHOLE)}
    one, two, split = points["1 GPU"], points["2 replicas"], points["tp = 2"]
    # One GPU: weights 2 x 656 + embedding and head 256 = 1,568 B leave 432 B: 3 sequences. A step reads
    # 1,312 (layers) + 128 (head) + 3 x 128 (KV) = 1,824 B: 1.824 s. Alone: 1,568 B, 1.568 s.
    assert (one.batch, one.latency_s, one.latency_alone_s) == (3, pytest.approx(1.824), pytest.approx(1.568))
    assert one.tokens_per_s == pytest.approx(3 / 1.824)
    assert two.tokens_per_s_per_gpu == pytest.approx(one.tokens_per_s) and two.latency_s == pytest.approx(1.824)
    # tp = 2: weights 2 x 336 + 128 = 800 B leave 1,200 B, 64 B a sequence: 18 sequences. A step reads
    # 672 + 64 + 18 x 64 = 1,888 B (1.888 s) and makes 4 all-reduces of 18 x 8 B: 4 x (0.01 + 144 / 1e6) s.
    loaded = 1.888 + 4 * (0.01 + 144 / 1e6)
    assert (split.batch, split.latency_s) == (18, pytest.approx(loaded))
    assert split.latency_alone_s == pytest.approx(0.8 + 4 * (0.01 + 8 / 1e6))  # alone: half the reads, + 40 ms
    assert split.tokens_per_s_per_gpu == pytest.approx(18 / loaded / 2)
    # tensor parallelism halves the wait of a lone request; its freed memory bought 6x the batch, which
    # here outweighs its all-reduces: 4.67 tokens/s per GPU against the replica's 1.64
    assert split.latency_alone_s < one.latency_alone_s and split.tokens_per_s_per_gpu > two.tokens_per_s_per_gpu


def test_at_the_same_batch_replicas_win_throughput_and_tp_wins_latency_by_hand():
    points = {p.label: p for p in latency_vs_throughput(HAND, HAND_GPU, degrees=(2,),
                                                       workload=Workload(context_tokens=4, prompt_tokens=4,
                                                                         memory_utilization=1.0, max_batch=3))}
    two, split = points["2 replicas"], points["tp = 2"]
    # both carry 3 sequences: tp = 2 reads 672 + 64 + 3 x 64 = 928 B, + 4 x (0.01 + 24 / 1e6) s
    step = 0.928 + 4 * (0.01 + 24 / 1e6)
    assert split.batch == two.batch == 3 and split.latency_s == pytest.approx(step)
    assert split.tokens_per_s_per_gpu == pytest.approx(3 / step / 2)
    assert two.tokens_per_s_per_gpu == pytest.approx(3 / 1.824)
    assert split.tokens_per_s_per_gpu < two.tokens_per_s_per_gpu
    assert split.latency_s < two.latency_s


def test_where_the_model_does_not_fit_one_gpu_replicas_are_not_an_option():
    small = GPU("small", 1000, 1000, 1e12, "made up", HAND_LINK)
    points = {p.label: p for p in latency_vs_throughput(HAND, small, degrees=(2,), workload=WHOLE)}
    assert not points["1 GPU"].feasible and not points["2 replicas"].feasible
    assert points["2 replicas"].problem.startswith("needs 2 kB of weights per GPU, more than the 1 kB")
    assert points["tp = 2"].feasible and points["tp = 2"].batch == 3  # (1,000 - 800) // 64
    assert "not an option: needs 2 kB" in format_latency_vs_throughput(points.values(), "hand")


def test_real_models_latency_against_throughput():
    # Llama-3-8B on H100s with 1K-token contexts: every copy carries the full 256 sequences, so the batch
    # is no one's advantage. TP answers faster, alone and loaded; replicas serve more tokens per GPU.
    short = Workload(context_tokens=1024, prompt_tokens=512)
    points = {p.label: p for p in latency_vs_throughput(LLAMA_3_8B, H100_80GB, workload=short)}
    for n in (2, 4, 8):
        reps, split = points[f"{n} replicas"], points[f"tp = {n}"]
        assert reps.batch == split.batch == 256
        assert split.latency_alone_s < reps.latency_alone_s and split.latency_s < reps.latency_s
        assert split.tokens_per_s_per_gpu < reps.tokens_per_s_per_gpu
    per_gpu = [points[f"tp = {n}"].tokens_per_s_per_gpu for n in (2, 4, 8)]
    assert per_gpu == sorted(per_gpu, reverse=True)  # the more ways, the more all-reduces per token
    # With 8K-token contexts a replica holds 52 sequences and tp = 4 holds 253: memory buys batch, and
    # the split copy serves more tokens per GPU.
    long = {p.label: p for p in latency_vs_throughput(LLAMA_3_8B, H100_80GB, workload=Workload(context_tokens=8192))}
    assert (long["4 replicas"].batch, long["tp = 4"].batch) == (52, 253)
    assert long["tp = 4"].tokens_per_s_per_gpu > long["4 replicas"].tokens_per_s_per_gpu
    # Llama-3-70B does not fit one H100: no replicas; tp = 2 fits with 2 sequences, tp = 8 with 256
    big = {p.label: p for p in latency_vs_throughput(LLAMA_3_70B, H100_80GB)}
    assert not big["8 replicas"].feasible and big["tp = 2"].batch == 2 and big["tp = 8"].batch == 256
    assert big["tp = 8"].latency_alone_s < big["tp = 4"].latency_alone_s < big["tp = 2"].latency_alone_s
