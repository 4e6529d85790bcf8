"""The planner: shape rules with their arithmetic, hand-worked memory and scores, published deployments."""

import pytest

from shardlib.hardware import (INFINIBAND_400G, NVLINK, ONE_H100, ONE_NODE_8_H100, TWO_NODES_8_H100, Cluster, Link,
                               toy_cluster)
from shardlib.models import LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY, ModelConfig
from shardlib.plan import (Layout, Workload, check_layout, check_mesh, enumerate_layouts, forward_traffic, format_plan,
                           layout_problems, memory_per_gpu, plan, score)

# Llama 3.1 405B, from its published config.json (hidden_size 16384, 126 layers, 128 heads, 8 KV heads,
# intermediate_size 53248, vocab 128256).
LLAMA_3_405B = ModelConfig("Llama-3-405B", n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8, d_ff=53248,
                           vocab_size=128256)


def reasons(model, cluster, layout, workload=Workload()):
    return " | ".join(layout_problems(model, cluster, layout, workload))


# -- bad input --------------------------------------------------------------------------------------------
def test_mesh_that_does_not_multiply_to_the_gpus_shows_the_arithmetic():
    with pytest.raises(ValueError, match=r"tp x pp x dp = 2 x 2 x 1 = 4, but there are 8 GPUs"):
        check_mesh(Layout(2, 2, 1), 8)
    with pytest.raises(ValueError, match="4, but there are 8 GPUs"):
        score(LLAMA_3_8B, ONE_NODE_8_H100, Layout(2, 2))


@pytest.mark.parametrize("field,value", [("nodes", 0), ("gpus_per_node", -1), ("memory_per_gpu_bytes", 0),
                                         ("nodes", 1.5), ("intra_link", "NVLink"), ("latency_charge", "sometimes")])
def test_bad_cluster_shapes(field, value):
    kwargs = dict(name="c", nodes=1, gpus_per_node=8, memory_per_gpu_bytes=80e9, intra_link=NVLINK,
                  inter_link=INFINIBAND_400G)
    kwargs[field] = value
    with pytest.raises(ValueError, match=field):
        Cluster(**kwargs)


def test_bad_layout_and_workload_values():
    with pytest.raises(ValueError, match="tp must be a whole number of at least 1, got 0"):
        Layout(0, 1)
    with pytest.raises(ValueError, match="prompt of 5000 tokens does not fit a context of 4096"):
        Workload(prompt_tokens=5000, context_tokens=4096)
    with pytest.raises(ValueError, match="objective"):
        plan(TOY, ONE_NODE_8_H100, objective="fastest")
    with pytest.raises(ValueError, match=r"tp=1 pp=1 dp=8 cannot serve Llama-3-70B on 1 node x 8 H100 80GB: "
                                         r"needs 141.1 GB of weights"):
        check_layout(LLAMA_3_70B, ONE_NODE_8_H100, Layout(1, 1, 8))


# -- shape rules, each with its numbers ------------------------------------------------------------------------
def test_tp_beyond_the_kv_heads_is_rejected_with_the_numbers():
    r = reasons(LLAMA_3_70B, TWO_NODES_8_H100, Layout(16, 1, 1))
    assert "tp = 16 exceeds the 8 KV heads" in r
    assert "8 KV heads cannot be split 16 ways" in r


def test_layers_must_divide_into_stages():
    model = ModelConfig("m", n_layers=30, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=64)
    cluster = Cluster("c", 1, 4, 80e9, NVLINK, INFINIBAND_400G)
    assert "30 layers cannot be cut into 4 equal stages (30 = 4 x 7 + 2)" in reasons(model, cluster, Layout(1, 4))


def test_expert_rules():
    cluster = Cluster("c", 1, 4, 80e9, NVLINK, INFINIBAND_400G)
    assert "Llama-3-8B is dense, it has no experts to spread" in reasons(LLAMA_3_8B, cluster, Layout(1, 1, 4, ep=2))
    assert "ep = 4 must divide the tp x dp = 2 x 1 = 2 ranks of a stage" in reasons(MIXTRAL_8X7B, cluster, Layout(2, 2, 1, ep=4))
    odd = Cluster("c", 1, 3, 80e9, NVLINK, INFINIBAND_400G)
    assert "8 experts cannot be spread evenly over 3 ranks (8 = 3 x 2 + 2)" in reasons(MIXTRAL_8X7B, odd, Layout(1, 1, 3, ep=3))
    # every enumerated MoE layout spreads a whole number of experts per rank
    assert all(MIXTRAL_8X7B.n_experts % lay.ep == 0 for lay in enumerate_layouts(MIXTRAL_8X7B, 8))
    assert {lay.ep for lay in enumerate_layouts(LLAMA_3_8B, 8)} == {1}


def test_tp_groups_may_not_straddle_nodes():
    model = ModelConfig("m", n_layers=4, d_model=96, n_heads=6, n_kv_heads=3, d_ff=96, vocab_size=96)
    cluster6 = Cluster("c", 3, 4, 80e9, NVLINK, INFINIBAND_400G)  # 12 GPUs: tp = 3 x dp = 4
    assert "tp = 3 groups would straddle nodes of 4 GPUs (4 % 3 = 1)" in reasons(model, cluster6, Layout(3, 1, 4))


# -- memory, hand-worked ----------------------------------------------------------------------------------------
def test_memory_of_llama_70b_at_tp8_by_hand():
    # per layer: q, o 2 x 8192 x 8192 = 134,217,728; k, v 2 x 8192 x 1024 = 16,777,216;
    # MLP 3 x 8192 x 28672 = 704,643,072; norms 2 x 8192 = 16,384: 855,654,400 parameters.
    # 80 layers = 68,452,352,000; embedding and head 2 x 128256 x 8192 = 2,101,346,304.
    # tp = 8, 2 bytes each: (68,452,352,000 + 2,101,346,304) / 8 x 2 = 17,638,424,576 bytes.
    # KV cache: 2 x 80 layers x (8/8) KV heads x 128 x 2 bytes x 8 sequences x 4096 tokens = 1,342,177,280.
    mem = memory_per_gpu(LLAMA_3_70B, Layout(8, 1), Workload(batch=8, context_tokens=4096))
    assert mem.weights_bytes == 17_638_424_576
    assert mem.kv_cache_bytes == 1_342_177_280


def test_rejection_for_memory_shows_the_sum():
    r = reasons(MIXTRAL_8X7B, ONE_H100, Layout(1, 1))
    assert "needs 93.4 GB of weights + 4.3 GB of KV cache = 97.7 GB per GPU, more than the 80.0 GB a GPU has" in r


# -- scores, hand-worked ---------------------------------------------------------------------------------------
SIMPLE_LINK = Link("simple", 1e9, 1e-3)  # 1 GB/s each way, 1 ms per message
SIMPLE = Cluster("simple", 1, 2, 1e9, SIMPLE_LINK, SIMPLE_LINK, memory_bytes_per_s=1e9, peak_flops_per_s=1e9,
                 latency_charge="per_call")


def test_decode_score_of_tp2_by_hand():
    wl = Workload(batch=1, context_tokens=8, prompt_tokens=8, microbatches=1)
    s = score(TOY, SIMPLE, Layout(2, 1), wl)
    mem = memory_per_gpu(TOY, Layout(2, 1), wl)
    # read the GPU's weights and KV cache at 1e9 B/s; then 2 x 4 all-reduces of 1 token x 64 x 4 B = 256 B,
    # each 1 ms (one alpha, per call) + 2(2-1)/2 x 256 / 1e9 s.
    expected = mem.total_bytes / 1e9 + 8 * (1e-3 + 256 / 1e9)
    assert s.decode_step_s == pytest.approx(expected, rel=1e-12)
    assert s.tokens_per_s == pytest.approx(1 / expected)
    assert s.bubble_fraction == 0 and s.n_microbatches == 1


def test_pipeline_score_pays_fill_and_drain_by_hand():
    wl = Workload(batch=4, context_tokens=8, prompt_tokens=8, microbatches=2)
    s = score(TOY, SIMPLE, Layout(1, 2), wl)
    mem = memory_per_gpu(TOY, Layout(1, 2), wl)
    stage = (mem.weights_bytes + mem.kv_cache_bytes / 2) / 1e9  # no tensor parallelism: no collectives
    hop = 1e-3 + 2 * 64 * 4 / 1e9  # one microbatch of 2 tokens
    assert s.decode_step_s == pytest.approx((2 + 2 - 1) * stage + hop, rel=1e-12)
    assert s.bubble_fraction == pytest.approx(1 / 3)  # (p - 1) / (m + p - 1)


def test_forward_traffic_by_hand():
    traffic = {(a.axis, a.op): (a.count, a.size_bytes) for a in forward_traffic(TOY, Layout(2, 2), 4, 6, 2)}
    mb = 2 * 6 * 64 * 4  # 2 sequences x 6 tokens x d_model 64 x 4 bytes = 3,072
    assert traffic[("tp", "all_reduce")] == (4 * 2 * 2 * 2, 4 * 2 * 2 * 2 * mb)  # 4 ranks x 2 layers x 2 x m
    assert traffic[("pp", "send")] == (1 * 2 * 2, 4 * mb)  # 1 boundary x 2 tp ranks x 2 microbatches
    assert traffic[("pp", "recv")] == traffic[("pp", "send")]


# -- published deployments ------------------------------------------------------------------------------------------
def test_llama_70b_served_with_tp8_in_one_node():
    # Meta's reference inference code (github.com/meta-llama/llama3, README "Inference"): Llama 3 70B runs
    # with model parallel 8, i.e. tp = 8, on one 8-GPU machine; 8B with model parallel 1.
    best = plan(LLAMA_3_70B, ONE_NODE_8_H100, objective="latency").best
    assert (best.layout.tp, best.layout.pp, best.layout.dp) == (8, 1, 1)
    assert best.tp_link == NVLINK.name
    rejected = {r.layout: r.reasons for r in plan(LLAMA_3_70B, ONE_NODE_8_H100).rejected}
    assert Layout(1, 1, 8) in rejected  # 141 GB of weights does not fit 80 GB


def test_llama_405b_tp_inside_nodes_pp_across():
    # Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", section 6.1): in BF16, 405B does not fit
    # one 8 x H100 machine; it is served on 16 GPUs in two machines, tensor parallel within each machine
    # (NVLink) and pipeline parallel across them.
    p = plan(LLAMA_3_405B, TWO_NODES_8_H100, objective="latency")
    assert (p.best.layout.tp, p.best.layout.pp, p.best.layout.dp) == (8, 2, 1)
    assert p.best.tp_link == NVLINK.name
    assert not plan(LLAMA_3_405B, ONE_NODE_8_H100).ranked  # nothing fits on one machine
    assert any("tp = 16 exceeds the 8 KV heads" in " ".join(r.reasons) for r in p.rejected)


def test_llama_8b_fits_on_one_gpu_so_replicas_win_throughput():
    # Meta's reference code runs Llama 3 8B with model parallel 1: it fits on one GPU. If it fits, replicas.
    best = plan(LLAMA_3_8B, ONE_NODE_8_H100, objective="throughput").best
    assert (best.layout.tp, best.layout.pp, best.layout.dp) == (1, 1, 8)
    assert plan(LLAMA_3_8B, ONE_H100).best.layout == Layout(1, 1, 1)


def test_mixtral_needs_two_or_more_gpus():
    # Mixtral of Experts (Jiang et al. 2024): 47B parameters in all (13B active per token); at 2 bytes each
    # that is over 90 GB, more than one 80 GB GPU.
    assert not plan(MIXTRAL_8X7B, ONE_H100).ranked
    two = Cluster("1 node x 2 H100 80GB", 1, 2, 80e9, NVLINK, INFINIBAND_400G)
    best = plan(MIXTRAL_8X7B, two).best
    # the best layout spreads one copy's weights over both GPUs (by tp, pp, or experts over ep = 2)
    assert best is not None and best.layout.tp * best.layout.pp * best.layout.ep == 2
    assert best.memory.weights_bytes < 80e9 < MIXTRAL_8X7B.weight_bytes


def test_every_layout_is_either_ranked_or_rejected_with_a_reason():
    for model in (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY):
        for cluster in (ONE_NODE_8_H100, TWO_NODES_8_H100):
            p = plan(model, cluster)
            assert len(p.ranked) + len(p.rejected) == len(enumerate_layouts(model, cluster.n_gpus))
            assert all(r.reasons and all(any(ch.isdigit() for ch in why) for why in r.reasons) for r in p.rejected)
            assert all(s.memory.total_bytes <= cluster.memory_per_gpu_bytes for s in p.ranked)
            assert format_plan(p).count("\n") >= 2


def test_toy_cluster_forces_a_split():
    p = plan(TOY, toy_cluster(SIMPLE_LINK), Workload(4, 6, 6, 2))
    assert p.ranked and all(s.layout.tp * s.layout.pp >= 3 for s in p.ranked)
    assert any("more than the 500 kB a GPU has" in " ".join(r.reasons) for r in p.rejected)


def test_planner_widget_follows_its_controls():
    import ipywidgets as widgets

    from shardlib.ui.plan_widgets import planner_widget

    app = planner_widget("Llama-3-70B", "1 node x 8 H100 80GB")
    controls = [c for box in app.children for c in (box.children if isinstance(box, widgets.Box) else (box,))]
    model_box = next(c for c in controls if getattr(c, "description", "") == "model")
    table = next(c for c in controls if isinstance(c, widgets.HTML))
    assert "Llama-3-70B on 1 node x 8 H100 80GB" in table.value
    model_box.value = "Mixtral-8x7B"
    assert "Mixtral-8x7B on 1 node x 8 H100 80GB" in table.value
    objective = next(c for c in controls if isinstance(c, widgets.ToggleButtons))
    objective.value = "latency"
    assert "ranked by latency" in table.value
    fig = next(c for c in controls if hasattr(c, "data"))
    assert len(fig.data) == 2  # throughput and latency bars
    fallback = planner_widget("no such model", "no such cluster")  # unknown names fall back to presets
    assert "Llama-3-70B" in next(c for c in fallback.children if isinstance(c, widgets.HTML)).value


def test_placement_tp_inside_nodes_pp_hops_between_them():
    from shardlib.plan import axis_link, hop_links

    layout = Layout(8, 2, 1)
    assert layout.tp_groups() == [list(range(8)), list(range(8, 16))]
    assert axis_link(TWO_NODES_8_H100, layout.tp_groups()) is NVLINK
    assert hop_links(layout, TWO_NODES_8_H100) == [INFINIBAND_400G]
    assert hop_links(Layout(2, 4, 1), ONE_NODE_8_H100) == [NVLINK] * 3


def test_tp_across_nodes_is_allowed_but_priced_on_the_slow_link():
    wide = ModelConfig("wide", n_layers=4, d_model=1024, n_heads=16, n_kv_heads=16, d_ff=4096, vocab_size=1024)
    s = score(wide, TWO_NODES_8_H100, Layout(16, 1, 1), Workload(batch=1, context_tokens=8, prompt_tokens=8))
    assert s.tp_link == INFINIBAND_400G.name
    assert s.notes == ("tp = 16 spans 2 nodes of 8: its all-reduces run over InfiniBand NDR 400 Gb/s",)
    inside = score(wide, TWO_NODES_8_H100, Layout(8, 1, 2), Workload(batch=1, context_tokens=8, prompt_tokens=8))
    assert inside.tp_link == NVLINK.name and not inside.notes
