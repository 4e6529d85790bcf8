"""The training memory model, published figures reproduced, and the training planner (pure: no ranks)."""

from __future__ import annotations

import dataclasses

import pytest

from shardlib.core.mesh import Layout
from shardlib.core.pipeline.registry import schedule_spec
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import H100_80GB, gpu_cluster
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.data_parallel import STATE_BYTES_MEGATRON, layer_activation_bytes
from shardlib.predict.serving.memory import Workload
from shardlib.predict.serving.planner import plan_serving
from shardlib.predict.serving.traffic import axis_link
from shardlib.predict.training.choices import LLAMA_3_PUBLISHED, training_choices
from shardlib.predict.training.memory import (
    in_flight,
    peak_training_memory,
    stage_params,
    training_memory,
)
from shardlib.predict.training.planner import best_configuration, plan_training, rank
from shardlib.predict.training.published import (
    ZERO_FIGURE_1_GB,
    activation_rows,
    deepspeed_zero3_estimate,
    megatron_rows,
    zero_figure_rows,
)
from shardlib.predict.training.time_model import (
    TrainingWorkload,
    axis_links,
    heaviest_stage_share,
    model_flops_per_token,
    score_training,
)
from shardlib.ui.tables import format_training_choices, format_training_plan


# -- layer_activation_bytes: Korthikanti et al. 2022, Table 2, each case by hand ---------------------------
@pytest.mark.parametrize("t", [2, 8])
def test_layer_activation_bytes_each_case_by_hand(t):
    model = LLAMA_3_8B  # h = 4096, a = 32
    s, b, h, a = 2048, 2, 4096, 32
    sbh = s * b * h
    assert layer_activation_bytes(model, s, b, "none") == sbh * (34 + 5 * a * s / h)
    assert layer_activation_bytes(model, s, b, "none", tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activation_bytes(model, s, b, "none", tp=t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    assert layer_activation_bytes(model, s, b, "selective", tp=t) == pytest.approx(sbh * (10 + 24 / t))
    assert layer_activation_bytes(model, s, b, "selective", tp=t, sequence_parallel=True) == pytest.approx(34 * sbh / t)
    assert layer_activation_bytes(model, s, b, "full", tp=t) == 2 * sbh
    assert layer_activation_bytes(model, s, b, "full", tp=t, sequence_parallel=True) == 2 * sbh / t
    assert layer_activation_bytes(model, s, b, "selective") == 34 * sbh  # positional recompute, as before


def test_layer_activation_bytes_refuses_bad_input():
    with pytest.raises(ValueError, match="recompute"):
        layer_activation_bytes(LLAMA_3_8B, 2048, 1, "some")
    with pytest.raises(ValueError, match="sequence_parallel"):
        layer_activation_bytes(LLAMA_3_8B, 2048, 1, "none", 2, "yes")


# -- the memory of one training GPU ------------------------------------------------------------------------
def test_stage_params_add_up_to_the_model():
    lay = Layout(tp=1, pp=4)
    assert sum(stage_params(LLAMA_3_8B, lay, s) for s in range(4)) == LLAMA_3_8B.n_params  # vocab 128,256 = 1002 x 128


def test_training_memory_by_hand():
    lay = Layout(tp=8, pp=16, dp=128, dp_strategy="zero1")
    m = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=0)
    d, per = 128, 6 + 12 / 128  # Megatron's distributed optimizer
    assert m.states_bytes == pytest.approx(m.params * per)
    assert m.params_bytes == pytest.approx(2 * m.params) and m.grads_bytes == pytest.approx(4 * m.params)
    assert m.optimizer_bytes == pytest.approx(12 * m.params / d)
    assert m.layers == 8 and m.in_flight == 16  # 126 layers over 16 stages: the first 14 get 8; 1F1B keeps p
    sbh = 8192 * 16384
    assert m.activations_bytes == pytest.approx(8 * 16 * 34 * sbh / 8)
    last = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=15)
    assert last.layers == 7 and last.in_flight == 1
    assert last.ends_bytes == pytest.approx(4 * sbh / 8 * (1 + 129024 / 16384))  # v padded to 126 x 1024
    assert peak_training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16).stage == 0


def test_cp_shards_the_optimizer_and_the_tokens():
    plain = training_memory(LLAMA_3_8B, Layout(1, 1, dp=8, dp_strategy="zero1"), 8192, 1, 1)
    ring = training_memory(LLAMA_3_8B, Layout(1, 1, dp=2, cp=4, dp_strategy="zero1"), 8192, 1, 1)
    assert ring.optimizer_bytes == pytest.approx(plain.optimizer_bytes)  # sharded over dp x cp = 8 both
    assert ring.activations_bytes == pytest.approx(plain.activations_bytes / 4)
    with pytest.raises(ValueError, match="ring slices"):
        training_memory(LLAMA_3_8B, Layout(1, 1, cp=3), 8192, 1, 1)
    with pytest.raises(ValueError, match="stage 4"):
        training_memory(LLAMA_3_8B, Layout(1, 4), 8192, 1, 4, stage=4)


def test_in_flight_microbatches():
    assert [in_flight(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight(0, 4, 2) == 2  # never more than there are
    assert in_flight(0, 4, 8, "interleaved-1f1b", chunks=2) == pytest.approx(4 * (1 + 3 / 8))  # Korthikanti 4.2.3
    assert in_flight(3, 4, 8, "interleaved-1f1b", chunks=2) == pytest.approx(1 + 3 / 2)
    for schedule, chunks in (("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 4)):  # the registry's peak
        assert in_flight(0, 4, 8, schedule, chunks=chunks) == schedule_spec(schedule).in_flight.peak(4, 8, chunks)
    with pytest.raises(ValueError, match="unknown schedule 'interleaved'; use one of '1f1b', 'interleaved-1f1b'"):
        in_flight(0, 4, 8, "interleaved")
    with pytest.raises(ValueError, match="unknown schedule 'zb-h1'"):  # the planner's model covers these two only
        TrainingWorkload(schedule="zb-h1")


# -- published figures ------------------------------------------------------------------------------------
def test_zero_figure_1_reproduced():
    rows = zero_figure_rows()
    assert [r.published for r in rows] == list(ZERO_FIGURE_1_GB.values()) == [120.0, 31.4, 16.6, 1.9]
    assert all(r.agrees for r in rows), [(r.what, r.ours) for r in rows]


def test_megatron_bytes_per_parameter():
    rows = megatron_rows(dp=64)
    assert [r.published for r in rows] == pytest.approx([20, 4 + 16 / 64, 18, 6 + 12 / 64, 16, 8 + 8 / 64, 16])
    assert all(r.ours == pytest.approx(r.published) for r in rows)
    assert STATE_BYTES_MEGATRON == {"params": 2, "grads": 4, "optimizer": 12}


def test_deepspeed_zero3_estimate_arithmetic():
    p, big = 7.5e9, 4 * 4096 ** 2
    no = deepspeed_zero3_estimate(p, big, 8, 8, cpu_offload=False)
    assert no["gpu_bytes"] == 4 * big + int(18 * p / 64)
    assert no["cpu_bytes"] == int(big * 4 * 8 * 1.5)
    both = deepspeed_zero3_estimate(p, big, 8, 8)
    assert both == {"gpu_bytes": 4 * big, "cpu_bytes": int(p * 18 / 8 * 1.5)}
    opt = deepspeed_zero3_estimate(p, big, 8, 8, cpu_offload_params=False, zero_init=False)
    assert opt == {"gpu_bytes": 4 * big + int(2 * p / 64), "cpu_bytes": int(p * max(32, 16 / 8) * 1.5)}


def test_korthikanti_table_2_for_530b():
    rows = {r.what.split(", ", 1)[1]: r for r in activation_rows()}
    assert all(r.ours == pytest.approx(r.published) for r in rows.values())
    sbh = 2048 * 20480 / 1e6
    assert rows["tensor + sequence parallel + selective recompute"].ours == pytest.approx(34 * sbh / 8)
    assert rows["no parallelism"].ours == pytest.approx(sbh * (34 + 5 * 128 * 2048 / 20480))


def test_stage_layer_counts_match_split_layers():
    from shardlib.core.pipeline.stages import split_layers

    for n, pp in ((126, 16), (32, 4), (80, 3), (7, 7)):
        assert list(stage_layer_counts(n, pp)) == [len(r) for r in split_layers(n, pp)]


# -- the training planner -----------------------------------------------------------------------------------



@pytest.mark.parametrize("model, nodes", [(LLAMA_3_8B, 1), (LLAMA_3_70B, 8), (LLAMA_3_70B, 16),
                                          (LLAMA_3_1_405B, 2048)])
def test_the_planner_returns_a_best_training_layout(model, nodes):
    cluster = gpu_cluster(H100_80GB, nodes)
    p = plan_training(model, cluster, TrainingWorkload(sequence_tokens=8192, global_batch_tokens=16 * 2 ** 20))
    best = p.best.layout
    assert best.tp * best.pp * best.dp * best.cp == cluster.n_gpus
    assert best.tp <= cluster.gpus_per_node and best.dp_strategy in ("ddp", "zero1", "zero2", "zero3")
    assert p.best.memory.total_bytes <= 0.9 * cluster.memory_per_gpu_bytes
    assert p.reasons and len(p.best.reasons) == 2 and "tokens/s" in p.reasons[0]
    assert 0.2 < p.best.mfu < 0.5  # at kernel efficiency 0.5, less what the bubble and exposed traffic cost
    assert all(a.tokens_per_s >= b.tokens_per_s * (1 - 1e-3) for a, b in zip(p.ranked, p.ranked[1:]))
    assert f"{p.best.layout.label:<30}" in format_training_plan(p)


def test_infeasible_layouts_are_rejected_with_numbers():
    p = plan_training(LLAMA_3_70B, gpu_cluster(H100_80GB, 16), TrainingWorkload())
    by_layout = {r.layout: r.reasons[0] for r in p.rejected}
    whole = by_layout[Layout(1, 1, 128)]  # 70B whole on each GPU
    assert "needs 1285.2 GB per GPU" in whole and "72.0 GB is usable (90% of 80.0 GB)" in whole
    assert any(r.startswith("tp = 16: its groups would cross nodes of 8 GPUs") for r in p.pruned)
    assert any(r.startswith("pp = 128: more stages than the 80 layers") for r in p.pruned)
    assert all(s.layout not in by_layout for s in p.ranked)


def test_pruned_axis_values():
    odd = TrainingWorkload(sequence_tokens=6144, global_batch_tokens=6144 * 96)  # 96 sequences
    p = plan_training(LLAMA_3_8B, gpu_cluster(H100_80GB, 8), odd)
    assert any(r.startswith("dp = 64: 96 sequences per step do not split over 64 replicas") for r in p.pruned)
    assert any(r.startswith("cp = 4: ring slices of 1,536 tokens, shorter than") for r in p.pruned)
    assert all(s.layout.dp in (1, 2, 4, 8, 16, 32) and s.layout.cp in (1,) for s in p.ranked)


def test_training_workload_refuses_bad_input():
    with pytest.raises(ValueError, match="not a whole number of sequences"):
        TrainingWorkload(sequence_tokens=8192, global_batch_tokens=10_000)
    with pytest.raises(ValueError, match="recompute"):
        TrainingWorkload(recompute=("some",))
    with pytest.raises(ValueError, match="recompute must be a non-empty tuple"):
        TrainingWorkload(recompute=())
    with pytest.raises(ValueError, match="dp_strategies"):
        TrainingWorkload(dp_strategies=("fsdp",))
    with pytest.raises(ValueError, match="schedule"):
        TrainingWorkload(schedule="gpipe")
    with pytest.raises(ValueError, match="sequence_tokens"):
        TrainingWorkload(sequence_tokens=0)
    with pytest.raises(ValueError, match="needs a TrainingWorkload"):
        plan_training(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), Workload())
    with pytest.raises(ValueError, match="needs a Workload"):
        plan_serving(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), TrainingWorkload(), objective="throughput")


def test_serving_objectives_still_work():
    p = plan_serving(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), Workload(), objective="throughput")
    assert p.best.layout.world_size == 8


def test_axis_links_match_the_rank_by_rank_placement():
    cluster = gpu_cluster(H100_80GB, 4)
    for lay in (Layout(2, 2, 2, cp=4), Layout(8, 2, 1, cp=2), Layout(4, 1, 4, cp=2), Layout(1, 4, 8)):
        links = axis_links(cluster, lay)
        for axis, groups in (("tp", lay.tp_groups()), ("cp", lay.cp_groups()), ("dp", lay.dp_cp_groups())):
            if len(groups[0]) > 1:
                assert links[axis] == axis_link(cluster, groups), (lay.label, axis)


def test_step_time_terms_by_hand():
    cluster = gpu_cluster(H100_80GB, 1)
    w = TrainingWorkload(sequence_tokens=4096, global_batch_tokens=4096 * 64, kernel_efficiency=0.5)
    s = score_training(LLAMA_3_8B, cluster, Layout(1, 4, 2, dp_strategy="zero1"), w, 1, "selective")
    per_token = model_flops_per_token(LLAMA_3_8B, 4096) + 4 * 32 * 4096 * 4096 / 2  # selective: causal attention again
    share = heaviest_stage_share(LLAMA_3_8B, 4, 4096)  # the last stage also runs the LM head
    assert share > 1
    assert s.compute_s == pytest.approx(4096 * 64 * per_token / (8 * 0.5 * 989e12) * share)
    assert s.n_microbatches == 32 and s.bubble_s == pytest.approx(3 * s.compute_s / 32)  # (p - 1) slots
    assert s.tp_s == 0 and s.cp_s == 0 and s.pp_s > 0
    assert s.tokens_per_s == pytest.approx(4096 * 64 / s.step_s)
    interleaved = dataclasses.replace(w, schedule="interleaved-1f1b", chunks=4)
    t = score_training(LLAMA_3_8B, cluster, Layout(1, 4, 2, dp_strategy="zero1"), interleaved, 1, "selective")
    assert t.compute_s == s.compute_s and t.bubble_s == pytest.approx(s.bubble_s / 4)  # (p - 1) / v slots


def test_ties_go_to_fewer_splits_then_lower_zero_stage():
    base = score_training(LLAMA_3_8B, gpu_cluster(H100_80GB, 1), Layout(1, 1, 8, dp_strategy="zero3"),
                          TrainingWorkload(), 1, "selective")
    a = dataclasses.replace(base, layout=Layout(1, 2, 4, dp_strategy="zero1"))
    b = dataclasses.replace(base, layout=Layout(1, 1, 8, dp_strategy="zero3"))
    c = dataclasses.replace(base, layout=Layout(1, 1, 8, dp_strategy="zero2"))
    assert [s.layout for s in rank([a, b, c])] == [c.layout, b.layout, a.layout]


def test_the_16k_gpu_plan_is_small_work(monkeypatch):
    """What keeps the 16K-GPU plan fast, without a clock: pruning leaves 188 layouts, each with at most
    one memory evaluation per microbatch size and recomputation, and only those that fit are timed
    (``benchmarks/bench_planners.py`` reads the time: about 0.2 s on a quiet 2-core machine)."""
    from shardlib.predict.training import planner, time_model

    calls = {"memory": 0, "score": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(time_model, "peak_training_memory", counted("memory", time_model.peak_training_memory))
    monkeypatch.setattr(planner, "score_training", counted("score", planner.score_training))
    w = TrainingWorkload()
    p = plan_training(LLAMA_3_1_405B, gpu_cluster(H100_80GB, 2048), w)
    assert p.best.layout.world_size == 16384
    layouts = len(p.ranked) + len(p.rejected)
    assert layouts == 188 and len(p.pruned) == 35, (layouts, len(p.pruned))
    assert calls["memory"] <= layouts * len(w.microbatch_sizes) * len(w.recompute)
    assert len(p.ranked) <= calls["score"] <= calls["memory"]  # only what fits is timed


def test_choices_beside_published_llama3_layouts():
    shown = [(p.layout.world_size, p.layout.tp, p.layout.cp, p.layout.pp, p.layout.dp, p.sequence_tokens)
             for p in LLAMA_3_PUBLISHED]  # the GPUs are the layout's: tp x cp x pp x dp
    assert shown == [(8192, 8, 1, 16, 64, 8192), (16384, 8, 1, 16, 128, 8192), (16384, 8, 16, 16, 8, 131072)]
    rows = training_choices()
    assert [(r.model, r.gpus) for r in rows] == [("Llama-3.1-405B", 8192), ("Llama-3.1-405B", 16384),
                                                 ("Llama-3.1-405B", 16384), ("Llama-3-8B", 8), ("Llama-3-70B", 64),
                                                 ("Llama-3-70B", 128)]
    assert all(r.chosen.layout.world_size == r.gpus and r.notes for r in rows)  # a layout of every GPU
    assert all("the published layout, FSDP as ZeRO-2" in r.notes[1] for r in rows[:3])
    assert [r.published.mfu for r in rows[:3]] == [0.43, 0.41, 0.38]  # Table 4 as printed
    for r in rows[:3]:  # the planner keeps tp in a node and 16 stages, as Meta did, and says where it differs
        assert (r.chosen.layout.tp, r.chosen.layout.pp) == (8, 16), r.chosen.layout
        assert r.chosen.layout.dp_strategy != "zero3"
    # the published layout needs recomputation here, and the row names the term and by how much
    assert rows[1].published_score.recompute == "full"
    assert any("the term that disagrees is memory" in n and "GB over" in n for n in rows[1].notes)
    text = format_training_choices(rows)
    assert "tp=8 pp=16 dp=128 FSDP" in text and "41%" in text


def test_lighter_end_stages_as_llama_3_cut_them():
    assert stage_layer_counts(126, 16, end_layers=1) == (7,) + (8,) * 14 + (7,)
    assert stage_layer_counts(126, 16) == (8,) * 14 + (7, 7)
    assert stage_layer_counts(4, 2, end_layers=1) == (2, 2)  # two stages: both are ends
    with pytest.raises(ValueError, match="each stage needs at least one whole layer"):
        stage_layer_counts(4, 4, end_layers=1)  # too few layers to lighten the ends: refused, not evened
    with pytest.raises(ValueError, match="each stage needs at least one whole layer"):
        stage_layer_counts(4, 8)
    lay = Layout(8, 16, 128, dp_strategy="zero2")
    even = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=0)
    light = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=0, lighter_ends=True)
    assert (even.layers, light.layers) == (8, 7) and light.activations_bytes == even.activations_bytes * 7 / 8
    peak = peak_training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, lighter_ends=True)
    assert peak.stage == 1  # stage 1 keeps 15 microbatches of 8 layers: more than stage 0's 16 of 7


def test_zero2_keeps_whole_weights_and_shards_the_rest():
    lay = Layout(8, 16, 128, dp_strategy="zero2")
    m = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=1)
    assert m.params_bytes == 2 * m.params and m.grads_bytes == pytest.approx(4 * m.params / 128)
    assert m.optimizer_bytes == pytest.approx(12 * m.params / 128) and m.gathered_bytes == 0


def test_a_collective_over_n_ranks_pays_n_minus_1_latencies():
    """A ring all-gather over 2,048 replicas pays 2,047 latencies: ZeRO-3 at tp 8, pp 1 cannot hide its gathers,
    and the 16K-GPU planner does not pick it; with one latency per call (the optimistic convention) it did."""
    cluster = gpu_cluster(H100_80GB, 2048)
    wide = Layout(8, 1, 2048, dp_strategy="zero3")
    ring = TrainingWorkload()
    once = dataclasses.replace(ring, latency_charge="per_call")
    a = best_configuration(LLAMA_3_1_405B, cluster, wide, ring)
    b = best_configuration(LLAMA_3_1_405B, cluster, wide, once)
    assert a.recompute == b.recompute and a.n_microbatches == 1
    latency = 2047 * cluster.inter_link.latency_s
    assert a.dp_s - b.dp_s == pytest.approx(3 * a.memory.layers * (latency - cluster.inter_link.latency_s), rel=0.05)
    best = plan_training(LLAMA_3_1_405B, cluster, ring).best
    assert best.layout.pp > 1 and best.dp_s < a.dp_s, best.layout


def test_causal_attention_counts_half_the_scores():
    full = model_flops_per_token(LLAMA_3_8B, 8192, causal=False)
    assert full - model_flops_per_token(LLAMA_3_8B, 8192) == 6 * 32 * 4096 * 8192
