"""The planners with expert parallelism: the DeepSeek-V3 preset, the node-limited all-to-all, expert data
parallelism in the training memory and step time, and the planner's DeepSeek-V3 choice beside the published one."""

from __future__ import annotations

import dataclasses

import pytest

from shardlib.core.mesh import Layout
from shardlib.facts.hardware import FOUR_NODES_8_H100, H100_80GB, H800, INFINIBAND_400G, NVLINK_H800, gpu_cluster
from shardlib.facts.models import DEEPSEEK_V3, DEEPSEEK_V3_FP8, LLAMA_3_8B, MIXTRAL_8X7B
from shardlib.predict.experts import ep_group_nodes, expert_all_to_all
from shardlib.predict.serving.decode import ep_all_to_all, score
from shardlib.predict.serving.planner import plan_serving
from shardlib.predict.shapes import kv_cache_bytes
from shardlib.predict.training.choices import DEEPSEEK_V3_PUBLISHED, deepseek_v3_choices
from shardlib.predict.training.memory import check_expert_layout, expert_dp, stage_params, training_memory
from shardlib.predict.training.planner import expert_degrees, plan_training
from shardlib.predict.training.time_model import TrainingWorkload, ep_all_to_all_s, score_training
from shardlib.ui.serving_reasons import score_reasons
from shardlib.ui.tables import format_training_choices

EXPERT = 3 * 7168 * 2048  # one DeepSeek-V3 expert: gate, up, down


def test_deepseek_v3_preset_is_its_published_shape():
    m = DEEPSEEK_V3
    assert (m.n_layers, m.d_model, m.n_heads, m.n_experts, m.experts_per_token, m.d_ff, m.vocab_size) == (
        61, 7168, 128, 256, 8, 2048, 129280)
    assert m.expert_params == EXPERT and m.node_limit == 4
    assert m.attention_params_per_layer == 187_105_280  # MLA's projections, not 4 x 7168 x 16384
    # 671B and 37B published; this count: dense first layers as MoE (+32.6B), no shared expert (-2.6B)
    assert m.n_params / 1e9 == pytest.approx(701.1, abs=0.1)
    assert m.active_params_per_token / 1e9 == pytest.approx(34.9, abs=0.1)
    assert m.kv_bytes_per_token() == 61 * 576 * 2  # the latent and the RoPE key, per layer, bf16
    assert kv_cache_bytes(m, 4096, tp=8) == kv_cache_bytes(m, 4096, tp=1) == 61 * 576 * 2 * 4096  # whole per rank
    assert "arXiv 2412.19437" in open(__import__("shardlib.facts.models").facts.models.__file__).read()


def test_deepseek_v3_fp8_as_shipped():
    """FP8 (e4m3) layer weights with a float32 scale per 128 x 128 block; embeddings, head, norms, router in bf16."""
    m = DEEPSEEK_V3_FP8
    assert m.matrix_bytes_per_param == 1 + 4 / (128 * 128) and m.n_params == DEEPSEEK_V3.n_params
    matrices = 61 * (187_105_280 + 256 * EXPERT)
    rest = DEEPSEEK_V3.n_params - matrices
    assert m.weight_bytes == pytest.approx(matrices * (1 + 4 / 16384) + 2 * rest)
    assert m.weight_bytes / 1e9 == pytest.approx(703.2, abs=0.1) and DEEPSEEK_V3.weight_bytes / 1e9 == pytest.approx(
        1402.2, abs=0.1)
    assert m.kv_bytes_per_token() == DEEPSEEK_V3.kv_bytes_per_token()  # the cache stays bf16


def test_deepseek_v3_serving_pick_and_the_published_prefill_unit():
    """Four nodes of 8 H100s, for throughput: the pick in bf16 and FP8, its margin, and DeepSeek's prefill unit
    (attention TP4 with sequence parallelism x DP8, MoE EP32, no PP; report section 3.4.1) scored beside it."""
    plans = {m.name: plan_serving(m, FOUR_NODES_8_H100) for m in (DEEPSEEK_V3, DEEPSEEK_V3_FP8)}
    for p in plans.values():
        assert p.best.layout == Layout(1, 2, 16, ep=16)  # each stage on 2 nodes: pp and ep both cross them
    fp8, bf16 = plans[DEEPSEEK_V3_FP8.name], plans[DEEPSEEK_V3.name]
    assert (fp8.best.batch, fp8.best.batch_set_by, bf16.best.batch) == (256, "max_batch", 100)
    assert fp8.ranked[1].layout == Layout(1, 1, 32, ep=32)
    assert fp8.best.tokens_per_s / fp8.ranked[1].tokens_per_s == pytest.approx(1.089, abs=0.005)  # about 9 %
    unit = score(DEEPSEEK_V3_FP8, FOUR_NODES_8_H100, Layout(4, 1, 8, ep=32))
    assert unit.layout in {s.layout for s in fp8.ranked}
    assert fp8.best.tokens_per_s / unit.tokens_per_s == pytest.approx(2.6, abs=0.1)  # the pick decodes more
    assert fp8.best.first_token_s / unit.first_token_s == pytest.approx(1.7, abs=0.1)  # the unit answers sooner


def test_ep_group_nodes():
    assert [ep_group_nodes(e, 8) for e in (1, 2, 8, 16, 64, 256)] == [1, 1, 1, 2, 8, 32]
    assert ep_group_nodes(12, 8) == 3  # 12 consecutive ranks from a multiple of 12 straddle up to 3 nodes


def test_expert_all_to_all_by_hand():
    row = 7168 * 2
    inside = expert_all_to_all(4096, 7168, 8, 8, 1, NVLINK_H800, INFINIBAND_400G)
    assert inside.network_bytes == 0 and inside.seconds == pytest.approx(7 * 5e-6 + 7 / 8 * 4096 * 8 * row / 160e9)
    free = expert_all_to_all(4096, 7168, 8, 64, 8, NVLINK_H800, INFINIBAND_400G)  # each row on its own
    assert (free.network_rows_per_token, free.node_rows_per_token) == (8 * 56 / 64, 8 * 7 / 64)
    assert free.network_s == pytest.approx(56 * 20e-6 + 4096 * 7 * row / 50e9)  # 56 GPUs on other nodes
    assert free.node_s == pytest.approx(7 * 5e-6 + 4096 * 0.875 * row / 160e9) and free.seconds == free.network_s
    limited = expert_all_to_all(4096, 7168, 8, 64, 8, NVLINK_H800, INFINIBAND_400G, node_limit=4)
    assert limited.network_rows_per_token == 4 * 7 / 8 and limited.network_bytes == 4096 * 3.5 * row
    assert limited.network_s == pytest.approx(7 * 20e-6 + 7 / 8 * 4096 * 4 * row / 50e9)
    assert limited.node_s == pytest.approx(7 * 5e-6 + 7 / 8 * 4096 * 8 * row / 160e9)
    assert limited.seconds == max(limited.network_s, limited.node_s) < free.seconds / 1.9  # about half the IB bytes
    assert expert_all_to_all(4096, 7168, 2, 64, 8, NVLINK_H800, INFINIBAND_400G, node_limit=4).network_rows_per_token \
        == 2 * 7 / 8  # k = 2 reaches at most 2 nodes anyway
    with pytest.raises(ValueError, match="node_limit"):
        expert_all_to_all(1, 8, 2, 4, 1, NVLINK_H800, INFINIBAND_400G, node_limit=-1)


def test_unlimited_all_to_all_prices_each_leg_on_its_link():
    """ep 16 over 2 nodes of 8, k 8, no node limit: of a token's 8 rows, 8 x 8/16 = 4 cross the network,
    8 x 7/16 = 3.5 go to the node's other GPUs over NVLink and 8/16 = 0.5 stay on the GPU."""
    row = 7168 * 2
    a = expert_all_to_all(1024, 7168, 8, 16, 2, NVLINK_H800, INFINIBAND_400G)
    assert (a.network_rows_per_token, a.node_rows_per_token) == (4.0, 3.5)
    assert 8 - a.network_rows_per_token - a.node_rows_per_token == 0.5
    assert (a.network_bytes, a.node_bytes) == (1024 * 4 * row, 1024 * 3.5 * row)
    assert a.network_s == pytest.approx(8 * 20e-6 + 1024 * 4 * row / 50e9)  # 8 peers on the other node
    assert a.node_s == pytest.approx(7 * 5e-6 + 1024 * 3.5 * row / 160e9)  # 7 peers in this one
    assert a.seconds == max(a.network_s, a.node_s) == a.network_s
    once = expert_all_to_all(1024, 7168, 8, 16, 2, NVLINK_H800, INFINIBAND_400G, latency_charge="per_call")
    assert once.network_s == pytest.approx(20e-6 + 1024 * 4 * row / 50e9)
    assert once.node_s == pytest.approx(5e-6 + 1024 * 3.5 * row / 160e9)
    # one definition: the node limit changes what crosses, not how a leg is priced
    limited = expert_all_to_all(1024, 7168, 8, 16, 2, NVLINK_H800, INFINIBAND_400G, node_limit=4)
    assert (limited.network_rows_per_token, limited.node_rows_per_token) == (1.0, 7.0)
    assert limited.network_s == pytest.approx(20e-6 + 1024 * 1 * row / 50e9)
    assert limited.node_s == pytest.approx(7 * 5e-6 + 1024 * 7 * row / 160e9)
    assert limited.seconds == max(limited.network_s, limited.node_s) < a.seconds


def test_serving_all_to_all_on_two_nodes_and_under_tp():
    cluster = gpu_cluster(H100_80GB, 2)
    free = dataclasses.replace(DEEPSEEK_V3, node_limit=0)
    a = ep_all_to_all(free, cluster, Layout(1, 1, 16, ep=16), 64)
    assert (a.nodes, a.network_rows_per_token, a.node_rows_per_token) == (2, 4.0, 3.5)
    assert a.seconds == max(a.network_s, a.node_s)
    # attention split tp = 4 ways: each tp rank routes a quarter of the replica's tokens (sequence parallel)
    split = ep_all_to_all(free, cluster, Layout(4, 1, 4, ep=16), 64)
    assert split.network_bytes == a.network_bytes / 4 and split.node_bytes == a.node_bytes / 4


def test_expert_data_parallel_memory_by_hand():
    lay = Layout(1, 16, 128, ep=64, dp_strategy="zero1")
    assert expert_dp(lay) == 2 and expert_dp(Layout(2, 1, 4, ep=4)) == 2 and expert_dp(Layout(2, 1, 4)) == 4
    mem = training_memory(DEEPSEEK_V3, lay, 4096, 1, 120, recompute="full", stage=1)  # 4 layers, no embedding
    assert mem.expert_params == 4 * 4 * EXPERT  # 256 / 64 experts per layer, whole
    dense = mem.params - mem.expert_params
    assert dense == 4 * (187_105_280 + 7168 * 256 + 2 * 7168)  # attention, router, norms, none split (tp 1)
    # Megatron's bytes: bf16 weights 2, fp32 grads 4, optimizer 12 sharded by ZeRO-1 over dp (dense) or 2 (experts)
    assert mem.params_bytes == 2 * mem.params and mem.grads_bytes == 4 * mem.params
    assert mem.optimizer_bytes == pytest.approx(12 * dense / 128 + 12 * mem.expert_params / 2)
    # ep = 1 keeps the old rule: every expert, split tp ways
    split = stage_params(MIXTRAL_8X7B, Layout(2, 1, 4), 0)
    whole = stage_params(MIXTRAL_8X7B, Layout(2, 1, 4, ep=4), 0)
    assert whole - split == pytest.approx(32 * (8 / 4 - 8 / 2) * MIXTRAL_8X7B.expert_params)


def test_bad_expert_layouts_are_refused_in_words():
    with pytest.raises(ValueError, match="ep = 3 does not divide the 256 experts of DeepSeek-V3: each rank holds"):
        check_expert_layout(DEEPSEEK_V3, Layout(1, 1, 6, ep=3))
    with pytest.raises(ValueError, match=r"ep = 8 must divide the tp x dp x cp = 1 x 4 x 1 = 4 ranks of a stage"):
        check_expert_layout(MIXTRAL_8X7B, Layout(1, 2, 4, ep=8))
    with pytest.raises(ValueError, match="Llama-3-8B is dense"):
        training_memory(LLAMA_3_8B, Layout(1, 1, 2, ep=2), 4096, 1, 1)
    assert expert_degrees(LLAMA_3_8B, 64) == [1] and expert_degrees(MIXTRAL_8X7B, 12) == [1, 2, 4]


def test_the_step_pays_the_all_to_alls_unless_they_overlap():
    cluster = gpu_cluster(H800, 256)
    w = TrainingWorkload(sequence_tokens=4096, global_batch_tokens=15360 * 4096)
    lay = Layout(1, 16, 128, ep=64, dp_strategy="zero1")
    s = score_training(DEEPSEEK_V3, cluster, lay, w, 1, "full")
    one = ep_all_to_all_s(DEEPSEEK_V3, cluster, lay, w, 1)
    limited = expert_all_to_all(4096, 7168, 8, 64, 8, NVLINK_H800, INFINIBAND_400G, 2.0, 4)
    assert one == limited.seconds
    assert s.ep_s == pytest.approx(2 * 3 * 4 * 120 * one)  # dispatch + combine, 3 passes, 4 layers, 120 microbatches
    assert s.links["ep"] == s.links["expert_dp"] == "InfiniBand NDR 400 Gb/s"
    hidden = score_training(DEEPSEEK_V3, cluster, lay, dataclasses.replace(w, ep_overlap=True), 1, "full")
    assert hidden.ep_s == 0 < s.ep_s and hidden.step_s == pytest.approx(s.step_s - s.ep_s)
    assert score_training(MIXTRAL_8X7B, gpu_cluster(H100_80GB, 1), Layout(2, 1, 4), TrainingWorkload(), 1,
                          "selective").ep_s == 0


def test_plan_training_searches_ep_for_moe_models():
    p = plan_training(MIXTRAL_8X7B, gpu_cluster(H100_80GB, 4), TrainingWorkload(sequence_tokens=4096,
                                                                                 global_batch_tokens=256 * 4096))
    eps = {s.layout.ep for s in p.ranked}
    assert {1, 2, 4, 8} <= eps and hasattr(p.best.layout, "ep")
    assert all(MIXTRAL_8X7B.n_experts % s.layout.ep == 0 for s in p.ranked)
    assert all((s.layout.tp * s.layout.dp * s.layout.cp) % s.layout.ep == 0 for s in p.ranked)


@pytest.fixture(scope="module")
def deepseek_rows():
    return deepseek_v3_choices()


def test_deepseek_v3_choice_beside_the_published_layout(deepseek_rows):
    exposed, overlapped = deepseek_rows
    assert (exposed.overlap, overlapped.overlap) == (False, True)
    pub = DEEPSEEK_V3_PUBLISHED
    lay = pub.layout
    assert (lay.tp, lay.pp, lay.ep, lay.dp, lay.dp_strategy, lay.world_size) == (1, 16, 64, 128, "zero1", 2048)
    for row in deepseek_rows:
        assert row.chosen is not None and row.chosen.layout.world_size == 2048
        assert row.published == pub and row.published_score.layout == pub.layout
        assert row.chosen.tokens_per_s >= row.published_score.tokens_per_s  # the planner's best beats what it scores
        assert any(r.startswith("the planner differs in") or r.startswith("the planner picks") for r in row.notes)
        assert any("ep = 64 spans 8 nodes" in r and "at most 4 nodes" in r for r in row.notes)
    assert overlapped.published_score.ep_s == 0 < exposed.published_score.ep_s  # DualPipe hides the all-to-alls
    text = format_training_choices(deepseek_rows)
    assert "tp=1 pp=16 dp=128 ep=64 ZeRO-1" in text and "DualPipe" in text


def test_serving_prices_node_limited_all_to_alls():
    cluster = gpu_cluster(H800, 8)
    lay = Layout(1, 1, 64, ep=64)
    limited = ep_all_to_all(DEEPSEEK_V3, cluster, lay, 16)
    free = ep_all_to_all(dataclasses.replace(DEEPSEEK_V3, node_limit=0), cluster, lay, 16)
    assert limited.nodes == free.nodes == 8 and limited.network_rows_per_token == 3.5 < free.network_rows_per_token
    assert limited.seconds < free.seconds
    p = plan_serving(DEEPSEEK_V3, gpu_cluster(H800, 4))
    assert p.best is not None and p.best.layout.ep > 1  # 701B of weights need the experts spread
    said = [r for r in score_reasons(p, p.best) if r.startswith("experts:")]
    assert said and f"{256 // p.best.layout.ep} of 256 per GPU" in said[0]
    if p.best.layout.ep > 8:  # its expert groups cross nodes: the node limit bounds what crosses
        assert "at most 4 nodes" in said[0]
    two = plan_serving(DEEPSEEK_V3, gpu_cluster(H100_80GB, 4))
    assert two.best.layout.ep == 16  # two nodes per expert group
    said = [r for r in score_reasons(two, two.best) if r.startswith("experts:")][0]
    assert "1.00 rows over InfiniBand NDR 400 Gb/s and 7.00 over NVLink" in said
    assert "with no limit 4.00 and 3.50" in said


def test_the_zero1_search_the_notebook_runs_picks_what_the_full_search_picks(deepseek_rows):
    small = deepseek_v3_choices(dp_strategies=("zero1",))
    assert [r.chosen.layout for r in small] == [r.chosen.layout for r in deepseek_rows]
    assert [r.published_score.step_s for r in small] == [r.published_score.step_s for r in deepseek_rows]
    assert deepseek_v3_choices(dp_strategies=("zero1",)) == small  # computed once, then cached
