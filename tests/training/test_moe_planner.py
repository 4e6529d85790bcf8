"""The planners with expert parallelism: the DeepSeek-V3 preset, the node-limited all-to-all, expert data
parallelism in the training memory and step time, and the planner's DeepSeek-V3 choice beside the published one."""

from __future__ import annotations

import dataclasses

import pytest

from shardlib.core.mesh import Layout
from shardlib.facts.hardware import H100_80GB, H800, INFINIBAND_400G, NVLINK_H800, gpu_cluster
from shardlib.facts.models import DEEPSEEK_V3, LLAMA_3_8B, MIXTRAL_8X7B
from shardlib.predict.experts import ep_group_nodes, expert_all_to_all
from shardlib.predict.serving.decode import ep_all_to_all
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


def test_ep_group_nodes():
    assert [ep_group_nodes(e, 8) for e in (1, 2, 8, 16, 64, 256)] == [1, 1, 1, 2, 8, 32]
    assert ep_group_nodes(12, 8) == 3  # 12 consecutive ranks from a multiple of 12 straddle up to 3 nodes


def test_expert_all_to_all_by_hand():
    row = 7168 * 2
    inside = expert_all_to_all(4096, 7168, 8, 8, 1, NVLINK_H800, INFINIBAND_400G)
    assert inside.network_bytes == 0 and inside.seconds == pytest.approx(7 * 5e-6 + 7 / 8 * 4096 * 8 * row / 160e9)
    free = expert_all_to_all(4096, 7168, 8, 64, 8, NVLINK_H800, INFINIBAND_400G)  # each copy on its own
    assert free.seconds == pytest.approx(63 * 20e-6 + 63 / 64 * 4096 * 8 * row / 50e9)
    limited = expert_all_to_all(4096, 7168, 8, 64, 8, NVLINK_H800, INFINIBAND_400G, node_limit=4)
    assert limited.network_rows_per_token == 4 * 7 / 8 and limited.network_bytes == 4096 * 3.5 * row
    assert limited.network_s == pytest.approx(7 * 20e-6 + 7 / 8 * 4096 * 4 * row / 50e9)
    assert limited.node_s == pytest.approx(7 * 5e-6 + 7 / 8 * 4096 * 8 * row / 160e9)
    assert limited.seconds == max(limited.network_s, limited.node_s) < free.seconds / 1.9  # about half the IB bytes
    assert expert_all_to_all(4096, 7168, 2, 64, 8, NVLINK_H800, INFINIBAND_400G, node_limit=4).network_rows_per_token \
        == 2 * 7 / 8  # k = 2 reaches at most 2 nodes anyway
    with pytest.raises(ValueError, match="node_limit"):
        expert_all_to_all(1, 8, 2, 4, 1, NVLINK_H800, INFINIBAND_400G, node_limit=-1)


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


def test_the_zero1_search_the_notebook_runs_picks_what_the_full_search_picks(deepseek_rows):
    small = deepseek_v3_choices(dp_strategies=("zero1",))
    assert [r.chosen.layout for r in small] == [r.chosen.layout for r in deepseek_rows]
    assert [r.published_score.step_s for r in small] == [r.published_score.step_s for r in deepseek_rows]
    assert deepseek_v3_choices(dp_strategies=("zero1",)) == small  # computed once, then cached
