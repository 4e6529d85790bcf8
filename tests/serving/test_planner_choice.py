"""The planner's choice across nodes: TP inside a node with PP across nodes, against TP across nodes.

The cost model (``predict.serving.decode``): a pipeline re-reads each stage's weights once per microbatch and runs
its stages one after another; tensor parallelism across nodes reads ``1/tp`` of the weights at once but
pays two all-reduces per layer over the network. Which wins depends on the numbers, and the reasons
say which did and by how much.
"""

from dataclasses import replace

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import H100_80GB, TWO_NODES_8_H100, gpu_cluster
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_70B, MIXTRAL_8X7B
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.planner import OBJECTIVES, plan_serving
from shardlib.predict.serving.traffic import PP_ACROSS, TP_ACROSS, counterpart, kind
from shardlib.predict.units import ms
from shardlib.ui.serving_reasons import plan_reasons, score_reasons
from shardlib.ui.tables import format_plan

# Made-up models with 16 KV heads, so that tensor parallelism may cross two 8-GPU nodes without copying
# KV heads; both too big for one node of 8 x 80 GB.
GQA16_600B = ModelConfig("gqa16-600B", n_layers=120, d_model=18432, n_heads=144, n_kv_heads=16, d_ff=73728,
                         vocab_size=128256)
GQA16_1T = ModelConfig("gqa16-1T", n_layers=128, d_model=24576, n_heads=192, n_kv_heads=16, d_ff=65536,
                       vocab_size=256000)
FOUR_NODES = gpu_cluster(H100_80GB, 4)
TWO_NODES_OF_2 = gpu_cluster(H100_80GB, 2, 2)


def best_of_each_kind(p, cluster):
    """The best-ranked layout that crosses nodes with its pipeline (TP inside), and the best that crosses
    them with tensor parallelism; their positions in the ranking."""
    kinds = [kind(s.layout, cluster) for s in p.ranked]
    pp_at, tp_at = kinds.index(PP_ACROSS), kinds.index(TP_ACROSS)
    return p.ranked[pp_at], pp_at, p.ranked[tp_at], tp_at


def too_big_for_one_node(model, cluster, workload):
    node = replace(cluster, nodes=1)
    return not plan_serving(model, node, workload).ranked


@pytest.mark.parametrize("model, cluster, context, copy", [
    (LLAMA_3_1_405B, TWO_NODES_8_H100, 1024, True),  # real; tp = 16 needs its 8 KV heads copied, as vLLM does
    (LLAMA_3_1_405B, TWO_NODES_8_H100, 4096, True),
    (LLAMA_3_1_405B, TWO_NODES_8_H100, 32768, True),  # copying halves tp = 16's batch: PP wins at every context
    (GQA16_600B, FOUR_NODES, 1024, False),
    (GQA16_600B, FOUR_NODES, 4096, False),
    (GQA16_1T, FOUR_NODES, 1024, False),
    (GQA16_1T, FOUR_NODES, 4096, False),
])
def test_pp_across_nodes_beats_tp_across_nodes_for_throughput_with_a_full_batch(model, cluster, context, copy):
    wl = Workload(context_tokens=context, prompt_tokens=min(1024, context), copy_kv_heads=copy)
    assert too_big_for_one_node(model, cluster, wl)
    p = plan_serving(model, cluster, wl, "throughput")
    pp_best, pp_at, tp_best, tp_at = best_of_each_kind(p, cluster)
    assert pp_at < tp_at and pp_best.tokens_per_s > tp_best.tokens_per_s
    assert p.best.layout == pp_best.layout  # and it is the planner's choice
    # the winner's reasons name the counterpart, the winner each way, and by how much
    versus = next(r for r in score_reasons(p, p.best) if "ms/token" in r and "tokens/s" in r)
    assert f"throughput: {PP_ACROSS} wins" in versus and "x the tokens" in versus


@pytest.mark.parametrize("model, cluster, context", [
    (GQA16_600B, FOUR_NODES, 16384),  # long contexts: 69 sequences fit, each all-reduce is small
    (LLAMA_3_70B, TWO_NODES_OF_2, 16384),
    (MIXTRAL_8X7B, gpu_cluster(H100_80GB, 2, 1), 4096),  # "nodes" of one GPU: no TP inside a node at all
])
def test_with_a_small_batch_tp_across_nodes_wins_throughput_and_the_reasons_say_why(model, cluster, context):
    # The honest exception: a pipeline re-reads each stage's weights for every microbatch, while its
    # counterpart's all-reduces, carrying few tokens, cost mostly their latency. The planner says so.
    p = plan_serving(model, cluster, Workload(context_tokens=context, prompt_tokens=1024), "throughput")
    kinds = [kind(s.layout, cluster) for s in p.ranked]
    tp_at = kinds.index(TP_ACROSS)
    assert all(k not in (PP_ACROSS, "PP across nodes") for k in kinds[:tp_at])
    why = next(r for r in score_reasons(p, p.ranked[tp_at]) if "Because" in r)
    assert f"throughput: {TP_ACROSS} wins" in why and "re-reads its weights" in why and "all-reduces over" in why


def test_latency_is_weighed_both_ways_with_the_margin():
    # 405B alone (one sequence): tp = 16 across nodes (KV heads copied) reads 1/16 of the weights at once,
    # while the pipeline's two stages of tp = 8 run one after another: TP across wins, by about 1.5x.
    copy = Workload(copy_kv_heads=True)
    p = plan_serving(LLAMA_3_1_405B, TWO_NODES_8_H100, copy, "latency")
    assert p.best.layout == Layout(16, 1, 1) and p.best.batch == 1
    by_layout = {s.layout: s for s in p.ranked}
    margin = by_layout[Layout(8, 2, 1)].decode_step_s / p.best.decode_step_s
    assert 1.3 < margin < 1.8
    why = next(r for r in score_reasons(p, p.best) if "Because" in r)
    assert f"Latency: {TP_ACROSS} wins, {margin:.2f}x faster" in why
    assert "paying 252 all-reduces over InfiniBand NDR 400 Gb/s" in why and "runs its 2 stages one after another" in why
    # A loaded server (64 sequences): each all-reduce now carries 64 tokens (2 MB) over the network, and the
    # pipeline wins latency too.
    q = plan_serving(LLAMA_3_1_405B, TWO_NODES_8_H100, replace(copy, batch=64), "latency")
    assert q.best.layout == Layout(8, 2, 1)
    assert f"Latency: {PP_ACROSS} wins" in next(r for r in score_reasons(q, q.best) if "Because" in r)


def test_without_copying_kv_heads_tp_across_is_ruled_out_and_the_margin_is_still_reported():
    p = plan_serving(LLAMA_3_1_405B, TWO_NODES_8_H100, Workload(copy_kv_heads=False), "latency")
    assert p.best.layout == Layout(8, 2, 1)  # as Meta served it; uneven stages (4 of 32, 32, 31, 31) rank below
    assert all(s.layout.tp <= 8 for s in p.ranked)
    line = next(r for r in score_reasons(p, p.best) if TP_ACROSS in r)
    assert line.startswith(f"{TP_ACROSS} (tp=16 pp=1 dp=1) is ruled out: tp = 16 exceeds the 8 KV heads")
    assert "With each KV head copied on 2 GPUs" in line and "x faster" in line


def test_counterparts_are_the_same_gpus_cut_the_other_way():
    assert counterpart(Layout(8, 2, 1), TWO_NODES_8_H100) == Layout(16, 1, 1)
    assert counterpart(Layout(16, 1, 1), TWO_NODES_8_H100) == Layout(8, 2, 1)
    assert counterpart(Layout(8, 4, 1), FOUR_NODES) == Layout(16, 2, 1)  # the fewest stages merged
    assert counterpart(Layout(16, 2, 1), FOUR_NODES) == Layout(8, 4, 1)
    assert counterpart(Layout(4, 4, 1), TWO_NODES_8_H100) == Layout(16, 1, 1)  # tp = 8 would stay inside a node
    assert counterpart(Layout(8, 1, 2), TWO_NODES_8_H100) is None  # nothing crosses a node but replicas
    assert counterpart(Layout(2, 4, 2), TWO_NODES_8_H100) is None  # its tp = 8 twin would stay inside a node
    assert kind(Layout(8, 2, 1), TWO_NODES_8_H100) == PP_ACROSS and kind(Layout(4, 4, 1), TWO_NODES_8_H100) == PP_ACROSS
    assert kind(Layout(16, 1, 1), TWO_NODES_8_H100) == TP_ACROSS


def test_reasons_are_plain_words_with_numbers_and_units():
    for model in (LLAMA_3_70B, LLAMA_3_1_405B):
        for objective in ("throughput", "latency"):
            text = format_plan(plan_serving(model, TWO_NODES_8_H100, Workload(), objective), reasons_for=3)
            assert "ms/token" in text and "tokens/s" in text and "why: best for" in text
            for line in text.split("rejected (")[0].splitlines():
                if line.startswith("  tp="):  # every reason line carries a number and a unit
                    assert any(ch.isdigit() for ch in line) and any(u in line for u in (" ms", " GB", " MB", "batch"))


def format_choices(models, clusters, workload: Workload = Workload()) -> str:
    """Each model on each cluster, both objectives: the planner's choice, why, and (where a pipeline can
    cross nodes) the margin between TP inside a node + PP across nodes and TP across nodes."""
    lines = []
    for model in models:
        for cluster in clusters:
            for objective in OBJECTIVES:
                p = plan_serving(model, cluster, workload, objective)
                b = p.best
                lines.append(f"{model.name} on {cluster.name}, by {objective}: " + (
                    f"{b.layout.label} ({kind(b.layout, cluster)}), batch {b.batch}, {ms(b.decode_step_s)}/token, "
                    f"{b.tokens_per_s:,.0f} tokens/s" if b else "nothing fits"))
                lines.append(f"    why: {plan_reasons(p)[-1]}")
                across = [r for s in p.ranked if kind(s.layout, cluster) == PP_ACROSS
                          for r in score_reasons(p, s) if TP_ACROSS in r]
                lines += [f"    across nodes: {r}" for r in across[:1]]  # the best-ranked such layout's
    return "\n".join(lines)


def test_choices_for_the_real_models_on_one_and_two_nodes():
    from shardlib.facts.hardware import ONE_NODE_8_H100
    from shardlib.facts.models import LLAMA_3_8B

    text = format_choices((LLAMA_3_8B, LLAMA_3_70B, LLAMA_3_1_405B, MIXTRAL_8X7B), (ONE_NODE_8_H100, TWO_NODES_8_H100))
    assert text.count(", by throughput: ") == text.count(", by latency: ") == 8
    assert "Llama-3.1-405B on 1 node x 8 H100 80GB, by throughput: nothing fits" in text
    assert ("Llama-3.1-405B on 2 nodes x 8 H100 80GB, by throughput: tp=8 pp=2 dp=1 "
            "(TP inside node + PP across nodes)") in text
    assert "Llama-3-70B on 1 node x 8 H100 80GB, by latency: tp=8 pp=1 dp=1" in text
    # on two nodes every model's pipeline across nodes is set against tp = 16 with its KV heads copied
    assert "is ruled out" not in text
    assert text.count("across nodes: TP inside node + PP across nodes (tp=8 pp=2 dp=1): ") >= 4


def test_each_pool_is_planned_on_its_own_first_token_for_prefill_throughput_for_decode():
    """DistServe's lever: Llama-3-8B on a node of 8 H100s a pool. The prefill pool splits the model over all 8
    GPUs (the soonest first token); the decode pool runs replicas of a smaller split (the most tokens)."""
    from shardlib.facts.hardware import ONE_NODE_8_H100
    from shardlib.facts.models import LLAMA_3_8B
    from shardlib.predict.serving.planner import plan_pools

    pools = plan_pools(LLAMA_3_8B, ONE_NODE_8_H100, ONE_NODE_8_H100)
    prefill, decode = pools.prefill.best, pools.decode.best
    assert (prefill.layout.tp, prefill.layout.dp) == (8, 1) and decode.layout.tp < 8 and decode.layout.dp > 1
    assert prefill.first_token_s == min(s.first_token_s for s in pools.prefill.ranked)
    assert decode.tokens_per_s == max(s.tokens_per_s for s in pools.decode.ranked)
    assert prefill.first_token_s < decode.first_token_s and decode.tokens_per_s > prefill.tokens_per_s
    (reason,) = plan_reasons(pools.prefill)
    assert reason.startswith("best for first_token: ") and f"a first token in {ms(prefill.first_token_s)}" in reason
