"""The planner: shape rules with their arithmetic, hand-worked memory and scores, published deployments."""

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, check_mesh
from shardlib.facts.hardware import (
    FOUR_NODES_8_H100,
    INFINIBAND_400G,
    NVLINK,
    ONE_H100,
    ONE_NODE_8_H100,
    TWO_NODES_8_H100,
    Cluster,
    Link,
    toy_cluster,
)
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, SHAPE_RULE_EXAMPLES, TOY
from shardlib.predict.serving.decode import score
from shardlib.predict.serving.memory import (
    Workload,
    affordable_batch,
    check_layout,
    layout_problems,
    memory_per_gpu,
    weights_per_gpu,
)
from shardlib.predict.serving.planner import enumerate_layouts, plan_serving
from shardlib.predict.serving.traffic import forward_traffic
from shardlib.ui.serving_reasons import score_notes, score_reasons
from shardlib.ui.tables import format_plan

LLAMA_3_405B = LLAMA_3_1_405B


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
        plan_serving(TOY, ONE_NODE_8_H100, objective="fastest")
    with pytest.raises(ValueError, match=r"tp=1 pp=1 dp=8 cannot serve Llama-3-70B on 1 node x 8 H100 80GB: "
                                         r"needs 141.1 GB of weights per GPU, more than the 72.0 GB a server fills "
                                         r"of each 80.0 GB GPU \(90%\)"):
        check_layout(LLAMA_3_70B, ONE_NODE_8_H100, Layout(1, 1, 8))


@pytest.mark.parametrize("changes, words", [
    ({"batch": -1}, r"batch \(0: sized from free memory\) must be a whole number of at least 0, got -1"),
    ({"microbatches": 1.5}, r"microbatches \(0: the planner chooses\) must be a whole number of at least 0, got 1.5"),
    ({"memory_utilization": 0}, "memory_utilization .* must be a number from 0.01 to 1, got 0"),
    ({"memory_utilization": 1.2}, "got 1.2"),
    ({"max_batch": 0}, "max_batch must be a whole number of at least 1, got 0"),
    ({"copy_kv_heads": "yes"}, "copy_kv_heads must be True or False, got 'yes'"),
    ({"kernel_efficiency": 0}, r"kernel_efficiency \(the share of peak bandwidth and FLOPs kernels reach; 1.0: the "
                               r"floor\) must be a number from 0.05 to 1, got 0"),
])
def test_bad_workloads_say_why(changes, words):
    with pytest.raises(ValueError, match=words):
        Workload(**changes)


# -- shape rules, each with its numbers ------------------------------------------------------------------------
def test_tp_beyond_the_kv_heads_is_priced_and_the_wall_is_a_choice():
    # by default the planner copies KV heads past their count (vLLM's way) and says what that costs
    assert reasons(LLAMA_3_70B, TWO_NODES_8_H100, Layout(16, 1, 1)) == ""
    s = score(LLAMA_3_70B, TWO_NODES_8_H100, Layout(16, 1, 1))
    notes = score_notes(LLAMA_3_70B, TWO_NODES_8_H100, s.layout, Workload())
    copy_note = next(n for n in notes if "KV heads copied" in n)
    assert copy_note.startswith("each of the 8 KV heads copied on 2 GPUs: a sequence's KV cache stays 168 MB per GPU, "
                                "as at tp = 8 (it would be 84 MB if it still shrank)")
    assert s.memory.weights_bytes > weights_per_gpu(LLAMA_3_70B, Layout(8, 1)) / 2  # the copied k, v weights
    r = reasons(LLAMA_3_70B, TWO_NODES_8_H100, Layout(16, 1, 1), Workload(copy_kv_heads=False))
    assert "tp = 16 exceeds the 8 KV heads (Workload(copy_kv_heads=False))" in r
    assert "8 KV heads cannot be split 16 ways" in r
    assert "cannot be shared by 12 devices" in reasons(LLAMA_3_70B, Cluster("c", 1, 12, 80e9, NVLINK, INFINIBAND_400G),
                                                       Layout(12, 1, 1))


def test_uneven_stages_are_priced_by_the_slowest():
    model = ModelConfig("m", n_layers=30, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=64)
    cluster = Cluster("c", 1, 4, 80e9, NVLINK, INFINIBAND_400G)
    assert reasons(model, cluster, Layout(1, 4)) == ""  # 8, 8, 7, 7 layers
    assert "cannot fill 8 stages" in reasons(ModelConfig("m", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4,
                                                         d_ff=128, vocab_size=64),
                                             Cluster("c", 1, 8, 80e9, NVLINK, INFINIBAND_400G), Layout(1, 8))
    s = score(model, cluster, Layout(1, 4), Workload(batch=4))
    assert [st.collectives for st in s.stages] == [0, 0, 0, 0]
    reads = [st.read_s for st in s.stages[:3]]
    assert reads[0] == reads[1] > reads[2]  # 8 layers, 8, then 7
    assert s.decode_stage_s == max(st.total_s for st in s.stages)
    assert "uneven stages of 8 and 7 layers: the 8-layer stages set the pace, the others wait 12% of each step" in \
        score_notes(model, cluster, s.layout, Workload(batch=4))


def test_uneven_stages_for_a_real_model():
    # Llama-3.1-405B has 126 layers: 4 stages hold 32, 32, 31, 31; the planner weighs them by the slowest.
    p = plan_serving(LLAMA_3_405B, FOUR_NODES_8_H100)
    by_layout = {s.layout: s for s in p.ranked}
    four = by_layout[Layout(8, 4, 1)]
    notes = score_notes(LLAMA_3_405B, FOUR_NODES_8_H100, four.layout, p.workload)
    assert any("uneven stages of 32 and 31 layers" in n for n in notes)
    assert four.stages[0].comm_s > four.stages[3].comm_s  # 64 all-reduces against 62
    assert [st.collectives for st in four.stages] == [64, 64, 62, 62]


@pytest.mark.parametrize("rule, layout, words", [
    # d_ff = 8,190 = 2 x 4,095: tp = 2 is allowed, tp = 4 is stopped by the MLP's width, not by the heads
    ("d_ff", Layout(4, 1, 2), "tp = 4: d_ff = 8190 cannot be split 4 ways"),
])
def test_each_shape_rule_binds_on_a_made_up_model(rule, layout, words):
    model = SHAPE_RULE_EXAMPLES[rule]
    p = plan_serving(model, ONE_NODE_8_H100)
    reasons_of = {r.layout: r.reasons for r in p.rejected}
    assert len(reasons_of[layout]) == 1 and reasons_of[layout][0].startswith(words)  # this rule and no other
    assert all(layout_problems(model, ONE_NODE_8_H100, s.layout, Workload()) == [] for s in p.ranked)


def test_a_padded_vocabulary_and_uneven_stages_refuse_nothing():
    for rule in ("vocab", "layers"):  # GPT-2's 50,257 tokens; 30 layers
        p = plan_serving(SHAPE_RULE_EXAMPLES[rule], ONE_NODE_8_H100)
        assert not [r for r in p.rejected if any("vocab" in x or "stages" in x for x in r.reasons)]


def test_expert_rules():
    cluster = Cluster("c", 1, 4, 80e9, NVLINK, INFINIBAND_400G)
    assert "Llama-3-8B is dense, it has no experts to spread" in reasons(LLAMA_3_8B, cluster, Layout(1, 1, 4, ep=2))
    assert "ep = 4 must divide the tp x dp = 2 x 1 = 2 ranks of a stage" in reasons(MIXTRAL_8X7B, cluster,
                                                                                    Layout(2, 2, 1, ep=4))
    odd = Cluster("c", 1, 3, 80e9, NVLINK, INFINIBAND_400G)
    uneven = reasons(MIXTRAL_8X7B, odd, Layout(1, 1, 3, ep=3))
    assert "8 experts cannot be spread evenly over 3 ranks (8 = 3 x 2 + 2)" in uneven
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
    # MLP 3 x 8192 x 28672 = 704,643,072: 855,638,016 split 8 ways; norms 2 x 8192 = 16,384 on every GPU.
    # 80 layers: 68,451,041,280 / 8 x 2 bytes = 17,112,760,320; norms 80 x 16,384 x 2 = 2,621,440;
    # embedding and head, padded to 128 x 8 = 1,024 rows: 2 x 129,024 x 8192 = 2,113,929,216 / 8 x 2 =
    # 528,482,304 (3,145,728 of it the 768 padded rows); the final norm 8192 x 2 = 16,384. Sum 17,643,880,448.
    # KV cache: 2 x 80 layers x (8/8) KV heads x 128 x 2 bytes x 8 sequences x 4096 tokens = 1,342,177,280.
    mem = memory_per_gpu(LLAMA_3_70B, Layout(8, 1), Workload(batch=8, context_tokens=4096))
    assert mem.weights_bytes == 17_643_880_448
    assert mem.kv_cache_bytes == 1_342_177_280


def test_batch_from_free_memory_by_hand():
    # 70B at tp = 8: 72 GB usable - 17,643,880,448 B of weights = 54,356,119,552 B free; one sequence of
    # 4,096 tokens is 1,342,177,280 / 8 = 167,772,160 B per GPU: 323 sequences, capped at max_batch 256.
    wl = Workload()
    assert affordable_batch(LLAMA_3_70B, ONE_NODE_8_H100, Layout(8, 1), wl) == 256
    assert affordable_batch(LLAMA_3_70B, ONE_NODE_8_H100, Layout(8, 1), Workload(max_batch=1000)) == 323
    # tp = 4: 35,278,815,232 B of weights (by the same sum) leave 36,721,184,768 B, 335,544,320 B a sequence: 109
    assert affordable_batch(LLAMA_3_70B, ONE_NODE_8_H100, Layout(4, 1, 2), wl) == 109
    s = score(LLAMA_3_70B, ONE_NODE_8_H100, Layout(4, 1, 2))
    assert (s.batch, s.batch_set_by) == (109, "free memory") and s.memory.total_bytes <= 72e9


def test_rejections_for_memory_show_the_sum():
    r = reasons(MIXTRAL_8X7B, ONE_H100, Layout(1, 1))
    assert r == "needs 93.4 GB of weights per GPU, more than the 72.0 GB a server fills of each 80.0 GB GPU (90%)"
    fixed = reasons(MIXTRAL_8X7B, ONE_H100, Layout(1, 1), Workload(batch=8))
    assert fixed.startswith("needs 93.4 GB of weights + 4.3 GB of KV cache (8 sequences x 4,096 tokens) "
                            "= 97.7 GB per GPU")
    # 70B on 2 GPUs: 70.6 GB each leave 1.4 GB, less than one 16K-token sequence's 2.7 GB share
    two = Cluster("2 x H100", 1, 2, 80e9, NVLINK, INFINIBAND_400G)
    r = reasons(LLAMA_3_70B, two, Layout(2, 1), Workload(context_tokens=16384))
    assert r.startswith("70.6 GB of weights leave 1.4 GB of the 72.0 GB") and "less than one sequence's KV cache" in r
    assert "(2.7 GB per GPU at 16,384 tokens)" in r


# -- scores, hand-worked ---------------------------------------------------------------------------------------
SIMPLE_LINK = Link("simple", 1e9, 1e-3)  # 1 GB/s each way, 1 ms per message
SIMPLE = Cluster("simple", 1, 2, 1e9, SIMPLE_LINK, SIMPLE_LINK, memory_bytes_per_s=1e9, peak_flops_per_s=1e12,
                 latency_charge="per_call")  # arithmetic 1000x faster than memory: decode is memory-bound
FAST_LINK = Link("free", 1e18, 0.0)
FAST = Cluster("free hops", 1, 2, 1e9, FAST_LINK, FAST_LINK, memory_bytes_per_s=1e9, peak_flops_per_s=1e12)
# TOY per layer, whole: q, o 2 x 64 x 64 = 8,192; k, v 2 x 64 x 32 = 4,096; MLP 3 x 64 x 256 = 49,152 (4 bytes
# each: 245,760 B) + norms 128 x 4 = 512 B on every GPU. Head 512 x 64 x 4 = 131,072 B. KV cache per
# sequence per layer at 8 tokens: 2 x 4 heads x 8 x 4 B x 8 = 2,048 B.


def test_decode_score_of_tp2_by_hand():
    wl = Workload(batch=1, context_tokens=8, prompt_tokens=8, microbatches=1)
    s = score(TOY, SIMPLE, Layout(2, 1), wl)
    # tp = 2 reads per GPU: 4 layers x (245,760 / 2 + 512) = 493,568 B, the head's half 65,536 B, and the
    # sequence's KV cache for its 2 of 4 KV heads, 2 x 4 layers x 2 x 8 x 4 B x 8 tokens = 4,096 B:
    # 563,200 B at 1e9 B/s.
    # Then 2 x 4 all-reduces of 1 token x 64 x 4 B = 256 B, each 1 ms (one alpha, per call) + 2(2-1)/2 x 256 / 1e9 s.
    expected = 563_200 / 1e9 + 8 * (1e-3 + 256 / 1e9)
    assert s.decode_step_s == pytest.approx(expected, rel=1e-12)
    assert s.tokens_per_s == pytest.approx(1 / expected)
    assert s.idle_fraction == 0 and s.n_microbatches == 1 and s.batch == 1 and s.batch_set_by == "the workload"


def test_steady_state_pipeline_by_hand():
    wl = Workload(batch=4, context_tokens=8, prompt_tokens=8, microbatches=2)
    s = score(TOY, SIMPLE, Layout(1, 2), wl)
    # 2 microbatches of 2 sequences. Stage 0: 2 layers x 246,272 B + KV 2 seq x 2 layers x 2,048 = 500,736 B;
    # stage 1 also reads the head: 631,808 B. Hops: 2 x 64 x 4 = 512 B to stage 1, then 2 token ids (8 B) back.
    stages = (500_736 / 1e9, 631_808 / 1e9)
    hops = (1e-3 + 512 / 1e9) + (1e-3 + 8 / 1e9)
    trip = sum(stages) + hops
    assert [st.total_s for st in s.stages] == pytest.approx(stages, rel=1e-12)
    assert s.trip_s == pytest.approx(trip, rel=1e-12)
    # no fill and drain per step: the cycle is the trip, or 2 x the slowest stage if that were longer
    assert s.decode_step_s == pytest.approx(max(trip, 2 * stages[1]), rel=1e-12) == pytest.approx(trip)
    assert s.tokens_per_s == pytest.approx(4 / trip)
    assert s.idle_fraction == pytest.approx(1 - 2 * stages[1] / trip)  # the slowest stage waits for the hops


def test_free_hops_keep_every_stage_busy_and_throughput_is_set_by_the_slowest_stage():
    s = score(TOY, FAST, Layout(1, 2), Workload(batch=4, context_tokens=8, prompt_tokens=8))
    assert s.n_microbatches == 2  # the planner chose m = pp: fewer idles a stage, more re-read the weights
    slowest = 631_808 / 1e9
    assert s.decode_step_s == pytest.approx(2 * slowest)  # 2 microbatches through the slowest stage
    assert s.tokens_per_s == pytest.approx(4 / (2 * slowest)) and s.idle_fraction == pytest.approx(0, abs=1e-12)


def test_slow_hops_make_the_planner_cut_more_microbatches():
    # with 1 ms per hop the trip, not the stages, sets the cycle: 4 microbatches of 1 sequence shorten the
    # trip (less KV cache read per stage) while 4 x the slowest stage (4 x 627,712 B at 1e9) still fits inside it
    s = score(TOY, SIMPLE, Layout(1, 2), Workload(batch=4, context_tokens=8, prompt_tokens=8))
    assert s.n_microbatches == 4
    assert s.decode_step_s == pytest.approx((496_640 + 627_712) / 1e9 + 2e-3 + (256 + 4) / 1e9)


def test_a_pipeline_does_not_shorten_a_tokens_trip():
    alone = Workload(batch=1, context_tokens=8, prompt_tokens=8)
    whole = score(TOY, FAST, Layout(1, 1, 2), alone)
    staged = score(TOY, FAST, Layout(1, 2, 1), alone)
    assert staged.decode_step_s == pytest.approx(whole.decode_step_s, rel=1e-9)  # the same bytes, read in turn
    split = score(TOY, FAST, Layout(2, 1, 1), alone)
    assert split.decode_step_s == pytest.approx(whole.decode_step_s / 2, rel=0.01)  # tensor parallelism halves it


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
    best = plan_serving(LLAMA_3_70B, ONE_NODE_8_H100, objective="latency").best
    assert (best.layout.tp, best.layout.pp, best.layout.dp) == (8, 1, 1)
    assert best.tp_link == NVLINK.name
    rejected = {r.layout: r.reasons for r in plan_serving(LLAMA_3_70B, ONE_NODE_8_H100).rejected}
    assert Layout(1, 1, 8) in rejected  # 141 GB of weights does not fit 80 GB


def test_llama_405b_tp_inside_nodes_pp_across():
    # Llama 3 paper (Dubey et al. 2024, "The Llama 3 Herd of Models", section 6.1): in BF16, 405B does not fit
    # one 8 x H100 machine; it is served on 16 GPUs in two machines, tensor parallel within each machine
    # (NVLink) and pipeline parallel across them.
    # The planner agrees for throughput; without copied KV heads (the paper's setting) for latency too.
    p = plan_serving(LLAMA_3_405B, TWO_NODES_8_H100)
    assert (p.best.layout.tp, p.best.layout.pp, p.best.layout.dp) == (8, 2, 1)
    assert p.best.tp_link == NVLINK.name
    strict = plan_serving(LLAMA_3_405B, TWO_NODES_8_H100, Workload(copy_kv_heads=False), objective="latency")
    assert strict.best.layout == Layout(8, 2, 1)
    assert any("tp = 16 exceeds the 8 KV heads" in " ".join(r.reasons) for r in strict.rejected)
    assert not plan_serving(LLAMA_3_405B, ONE_NODE_8_H100).ranked  # nothing fits on one machine in bf16
    fp8 = plan_serving(LLAMA_3_405B.quantized(8), ONE_NODE_8_H100).best  # Meta's FP8 405B: one 8 x H100 node
    assert fp8.layout == Layout(8, 1, 1) and fp8.batch > 64


def test_llama_8b_fits_on_one_gpu_so_replicas_win_throughput_when_memory_holds_a_full_batch():
    # Meta's reference code runs Llama 3 8B with model parallel 1: it fits on one GPU. With 1K-token
    # contexts a replica's free memory holds the full batch of 256, and replicas win throughput.
    short = Workload(context_tokens=1024, prompt_tokens=512)
    best = plan_serving(LLAMA_3_8B, ONE_NODE_8_H100, short, objective="throughput").best
    assert (best.layout.tp, best.layout.pp, best.layout.dp, best.batch) == (1, 1, 8, 256)
    assert plan_serving(LLAMA_3_8B, ONE_H100).best.layout == Layout(1, 1, 1)
    # With 4K-token contexts a replica's 56 GB of free memory holds only 104 sequences; tp = 2 halves the
    # weights per GPU and holds 238 per pair, and that batch pays for its all-reduces: memory buys batch.
    p = plan_serving(LLAMA_3_8B, ONE_NODE_8_H100, Workload(context_tokens=4096), objective="throughput")
    by_layout = {s.layout: s for s in p.ranked}
    replicas, pairs = by_layout[Layout(1, 1, 8)], by_layout[Layout(2, 1, 4)]
    assert (replicas.batch, pairs.batch) == (104, 238) and pairs.tokens_per_s > replicas.tokens_per_s
    assert "set by free memory" in score_reasons(p, p.best)[0]


def test_mixtral_needs_two_or_more_gpus():
    # Mixtral of Experts (Jiang et al. 2024): 47B parameters in all (13B active per token); at 2 bytes each
    # that is over 90 GB, more than one 80 GB GPU.
    assert not plan_serving(MIXTRAL_8X7B, ONE_H100).ranked
    two = Cluster("1 node x 2 H100 80GB", 1, 2, 80e9, NVLINK, INFINIBAND_400G)
    best = plan_serving(MIXTRAL_8X7B, two).best
    # the best layout spreads one copy's weights over both GPUs (by tp, pp, or experts over ep = 2)
    assert best is not None and best.layout.tp * best.layout.pp * best.layout.ep == 2
    assert best.memory.weights_bytes < 80e9 < MIXTRAL_8X7B.weight_bytes


def test_every_layout_is_either_ranked_or_rejected_with_a_reason():
    for model in (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY):
        for cluster in (ONE_NODE_8_H100, TWO_NODES_8_H100):
            p = plan_serving(model, cluster)
            assert len(p.ranked) + len(p.rejected) == len(enumerate_layouts(model, cluster.n_gpus))
            assert all(r.reasons and all(any(ch.isdigit() for ch in why) for why in r.reasons) for r in p.rejected)
            assert all(s.memory.total_bytes <= cluster.memory_per_gpu_bytes for s in p.ranked)
            assert format_plan(p).count("\n") >= 2


def test_toy_cluster_forces_a_split():
    p = plan_serving(TOY, toy_cluster(SIMPLE_LINK), Workload(4, 6, 6, 2))
    assert p.ranked and all(s.layout.tp * s.layout.pp >= 3 for s in p.ranked)
    assert any("more than the 450 kB a server fills of each 500 kB GPU" in " ".join(r.reasons) for r in p.rejected)


def test_planner_widget_follows_its_controls():
    import ipywidgets as widgets

    from shardlib.ui.serving_widgets import planner_widget

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
    area = next(c for c in controls if hasattr(c, "figure"))
    assert len(area.figure.data) == 2  # throughput and latency bars
    weights = next(c for c in controls if getattr(c, "description", "") == "weights")
    model_box.value, weights.value = "Llama-3-70B", 4
    assert "Llama-3-70B 4-bit on 1 node x 8 H100 80GB" in table.value
    batch = next(c for c in controls if getattr(c, "description", "") == "batch per replica")
    batch.value = 16
    assert "batch 16 per replica, as the workload fixes it" in table.value
    assert "times are floors" in table.value and "floors at 100% of peak" in area.figure.layout.title.text
    efficiency = next(c for c in controls if getattr(c, "description", "") == "kernel efficiency")
    efficiency.value = 0.8
    assert "kernels at 80% of peak" in table.value and "not a measurement" in area.figure.layout.title.text
    fallback = planner_widget("no such model", "no such cluster")  # unknown names fall back to presets
    assert "Llama-3-70B" in next(c for c in fallback.children if isinstance(c, widgets.HTML)).value


def test_placement_tp_inside_nodes_pp_hops_between_them():
    from shardlib.predict.serving.traffic import axis_link, hop_links

    layout = Layout(8, 2, 1)
    assert layout.tp_groups() == [list(range(8)), list(range(8, 16))]
    assert axis_link(TWO_NODES_8_H100, layout.tp_groups()) is NVLINK
    assert hop_links(layout, TWO_NODES_8_H100) == [INFINIBAND_400G]
    assert hop_links(Layout(2, 4, 1), ONE_NODE_8_H100) == [NVLINK] * 3


def test_tp_across_nodes_is_allowed_but_priced_on_the_slow_link():
    wide = ModelConfig("wide", n_layers=4, d_model=1024, n_heads=16, n_kv_heads=16, d_ff=4096, vocab_size=1024)
    s = score(wide, TWO_NODES_8_H100, Layout(16, 1, 1), Workload(batch=1, context_tokens=8, prompt_tokens=8))
    assert s.tp_link == INFINIBAND_400G.name
    assert score_notes(wide, TWO_NODES_8_H100, s.layout, Workload()) == (
        "tp = 16 spans 2 nodes of 8: its all-reduces run over InfiniBand NDR 400 Gb/s",)
    inside = score(wide, TWO_NODES_8_H100, Layout(8, 1, 2), Workload(batch=1, context_tokens=8, prompt_tokens=8))
    assert inside.tp_link == NVLINK.name and not score_notes(wide, TWO_NODES_8_H100, inside.layout, Workload())


def test_kernel_efficiency_scales_the_floor():
    floor = score(LLAMA_3_70B, ONE_NODE_8_H100, Layout(8, 1), Workload(batch=1))
    real = score(LLAMA_3_70B, ONE_NODE_8_H100, Layout(8, 1), Workload(batch=1, kernel_efficiency=0.8))
    assert real.stages[0].read_s == pytest.approx(floor.stages[0].read_s / 0.8)
    assert real.stages[0].comm_s == floor.stages[0].comm_s  # the links keep their own figures
    assert real.decode_step_s > floor.decode_step_s
    assert "times are floors, at 100% of peak" in format_plan(plan_serving(LLAMA_3_8B, ONE_NODE_8_H100))
    real_plan = plan_serving(LLAMA_3_8B, ONE_NODE_8_H100, Workload(kernel_efficiency=0.8))
    assert "kernels at 80% of peak" in format_plan(real_plan)


def test_forward_traffic_counts_every_layer_once_per_stage_rank_even_with_uneven_stages():
    # TOY's 4 layers in 3 stages (2, 1, 1), tp = 2: 2 all-reduces per layer per microbatch on each of a
    # stage's 2 ranks, 2 x 2 x 4 x 2 = 32 calls; 2 boundaries x 2 tp ranks x 2 microbatches = 8 sends
    traffic = {(a.axis, a.op): a.count for a in forward_traffic(TOY, Layout(2, 3), 4, 6, 2)}
    assert traffic == {("tp", "all_reduce"): 32, ("pp", "send"): 8, ("pp", "recv"): 8}
    with pytest.raises(ValueError, match=r"batch 4 into 3 microbatches \(4 % 3 = 1\)"):
        forward_traffic(TOY, Layout(2, 2), 4, 6, 3)


@pytest.mark.parametrize("layout", [Layout(2, 2, 2, cp=2), Layout(2, 1, 2, cp=2, dp_strategy="zero3"), Layout(1, 3, 2),
                                    Layout(4, 2, 1, cp=2)])
def test_every_axis_partitions_the_ranks_and_tp_is_innermost(layout):
    for axis, size in (("tp", layout.tp), ("cp", layout.cp), ("pp", layout.pp), ("dp", layout.dp)):
        groups = getattr(layout, f"{axis}_groups")()
        assert sorted(r for g in groups for r in g) == list(range(layout.world_size))
        assert all(len(g) == size for g in groups)
    assert all(g == list(range(g[0], g[0] + layout.tp)) for g in layout.tp_groups())  # consecutive ranks
    for r in range(layout.world_size):
        p = layout.position(r)
        assert layout.rank(p.stage, p.replica, p.tp_rank, p.cp_rank) == r
    assert sorted(r for g in layout.dp_cp_groups() for r in g) == list(range(layout.world_size))
    assert len(layout.mesh_shape) == len(layout.mesh_axes)


def test_a_layout_with_cp_refuses_three_coordinates_and_a_bad_strategy():
    with pytest.raises(ValueError, match="use position"):
        Layout(2, 1, 1, cp=2).coords(0)
    with pytest.raises(ValueError, match="dp_strategy"):
        Layout(2, 1, dp_strategy="zero4")
    with pytest.raises(ValueError, match="tp x pp x dp x cp = 2 x 1 x 1 x 2 = 4, but there are 8"):
        check_mesh(Layout(2, 1, cp=2), 8)


def test_llama_8b_on_one_node_moves_from_replicas_to_wider_splits_as_the_context_grows():
    """The planner widget's answer in notebook 05, which 07 cites: Llama-3-8B on a node of 8 H100s, ranked
    by throughput, batch from memory: replicas up to 2K tokens, then tp 2, 4 and 8 at 4K, 8K and 16K."""
    picks = {ctx: plan_serving(LLAMA_3_8B, ONE_NODE_8_H100, Workload(batch=0, context_tokens=ctx,
                                                                       prompt_tokens=min(2048, ctx)),
                               "throughput").best.layout.tp for ctx in (1024, 2048, 4096, 8192, 16384)}
    assert picks == {1024: 1, 2048: 1, 4096: 2, 8192: 4, 16384: 8}
