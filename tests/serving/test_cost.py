"""One forward pass under tensor parallelism (``predict.serving.cost``) against numbers worked by hand (the working
is in the comments): decode against prefill, the chapter's two lessons, the crossover batch, the table,
pipeline against tensor traffic, what fits; the planner's stage costs built on the same TP all-reduces;
the figures and the explorer widget drawn from them."""

import math

import pytest

from shardlib.facts.hardware import ETHERNET_100G, LINKS, NVLINK, PCIE_GEN4, Link
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.serving.cost import (
    decode_crossover_batch,
    pipeline_vs_tensor,
    tp_all_reduces,
    tp_cost_table,
    tp_decode_cost,
    tp_prefill_cost,
)
from shardlib.ui.tables import format_tp_cost_table


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18)


def test_decode_per_token_by_hand():
    # Llama-3-8B: 32 layers x 2 = 64 all-reduces of one 4096-wide bf16 vector = 8,192 bytes.
    # NVLink, tp = 2, per call: 64 x (5 us + 1 x 8192 / 450e9) = 64 x 5.018204 us = 321.165 us
    cost = tp_decode_cost(LLAMA_3_8B, 2, NVLINK)
    assert (cost.collectives, cost.size_bytes) == (64, 8192)
    assert close(cost.total_s, 64 * (5e-6 + 8192 / 450e9))
    assert cost.bound == "latency"
    # batch of 8 sequences: 8 vectors per all-reduce
    assert tp_decode_cost(LLAMA_3_8B, 2, NVLINK, batch=8).size_bytes == 8 * 8192


def test_prefill_by_hand():
    # 2048-token prompt: 2048 x 4096 x 2 = 16,777,216 bytes per all-reduce
    # NVLink tp = 2: 64 x (5 us + 16777216 / 450e9 = 37.283 us) = 2.706 ms
    cost = tp_prefill_cost(LLAMA_3_8B, 2, NVLINK, 2048)
    assert cost.size_bytes == 16_777_216
    assert close(cost.total_s, 64 * (5e-6 + 16_777_216 / 450e9))
    assert cost.bound == "bandwidth"
    # PCIe Gen4, tp = 2: 64 x (10 us + 16777216 / 31.5e9 = 532.6 us) = 34.71 ms
    assert close(tp_prefill_cost(LLAMA_3_8B, 2, PCIE_GEN4, 2048).total_s, 64 * (10e-6 + 16_777_216 / 31.5e9))


def test_lesson_one_decode_does_not_improve_with_fewer_shards():
    for link in LINKS.values():
        decode = [tp_decode_cost(LLAMA_3_8B, n, link).total_s for n in (2, 4, 8)]
        assert max(decode) / min(decode) < 1.02, link.name  # the same within 2 %: latency, not data
        assert all(tp_decode_cost(LLAMA_3_8B, n, link).bound == "latency" for n in (2, 4, 8))
    # charged per ring step instead, decode gets worse with more shards: 2(n-1) latencies per all-reduce
    ring = [tp_decode_cost(LLAMA_3_8B, n, NVLINK, latency_charge="per_step").total_s for n in (2, 4, 8)]
    assert ring[0] < ring[1] < ring[2]


def test_decode_turns_bandwidth_bound_past_a_crossover_batch():
    # per call, tp = 8: 5 us = 1.75 x b x 8192 B / 450e9 B/s  ->  b = 5e-6 x 450e9 / (1.75 x 8192) = 156.9
    assert close(decode_crossover_batch(LLAMA_3_8B, 8, NVLINK), 5e-6 * 450e9 / (1.75 * 8192))
    assert 21.5 < decode_crossover_batch(LLAMA_3_8B, 8, PCIE_GEN4) < 22.5  # 10 us x 31.5e9 / (1.75 x 8192)
    assert tp_decode_cost(LLAMA_3_8B, 8, NVLINK, 150).bound == "latency"
    assert tp_decode_cost(LLAMA_3_8B, 8, NVLINK, 160).bound == "bandwidth"
    # Llama-3-70B, tp = 8, batch 256: 4 MiB per all-reduce, 16.3 us of bytes against 5 us of latency
    loaded = tp_decode_cost(LLAMA_3_70B, 8, NVLINK, 256)
    assert loaded.size_bytes == 4 * 2 ** 20 and loaded.bound == "bandwidth"
    assert close(loaded.bandwidth_s / loaded.collectives, 1.75 * 4 * 2 ** 20 / 450e9)
    # per ring step the latency is 2(n-1) times larger, and so is the crossover
    per_call = decode_crossover_batch(LLAMA_3_8B, 8, NVLINK)
    assert close(decode_crossover_batch(LLAMA_3_8B, 8, NVLINK, "per_step"), 14 * per_call)
    assert decode_crossover_batch(LLAMA_3_8B, 1, NVLINK) == math.inf


def test_lesson_two_prefill_depends_on_bandwidth():
    prefill = {name: tp_prefill_cost(LLAMA_3_8B, 8, link, 2048) for name, link in LINKS.items()}
    assert all(c.bound == "bandwidth" for c in prefill.values())
    times = sorted(c.total_s for c in prefill.values())
    assert times[-1] / times[0] > 30  # 100 GbE against NVLink: 12.5 vs 450 GB/s
    # and, unlike decode, it tracks the link's rate: PCIe Gen4 is about twice as slow as Gen5
    gen4, gen5 = prefill["PCIe Gen4 x16"].total_s, prefill["PCIe Gen5 x16"].total_s
    assert 1.8 < gen4 / gen5 < 2.0


def test_one_shard_needs_no_collectives():
    cost = tp_prefill_cost(LLAMA_3_8B, 1, NVLINK, 512)
    assert cost.collectives == 0 and cost.total_s == 0.0 and cost.bound == "none"


def test_the_table_reproduces_the_costs():
    rows = tp_cost_table(LLAMA_3_8B, LINKS.values())
    assert [r["link"] for r in rows] == list(LINKS)
    assert rows[0]["decode"][2] == tp_decode_cost(LLAMA_3_8B, 2, NVLINK)
    text = format_tp_cost_table(LLAMA_3_8B, LINKS.values())
    assert "64 all-reduces per forward pass" in text and "8,192 bytes" in text and "16,777,216 bytes" in text
    nvlink_row = next(line for line in text.splitlines() if line.startswith("NVLink"))
    assert nvlink_row.split()[-6:-3] == ["321", "322", "322"]  # decode us per token at tp = 2, 4, 8
    assert nvlink_row.split()[-3] == "2.7"  # prefill ms at tp = 2


def test_pipeline_communicates_far_less_than_tensor():
    # 4 devices, 2048 tokens, S = 16,777,216 bytes of activations.
    # Tensor: 64 all-reduces, each device sends 2(n-1)/n = 1.5 S of each: 4 x 64 x 1.5 S = 384 S in all.
    # Pipeline: 3 boundaries, one send of S each = 3 S. Ratio 128 = 4 x 32 layers.
    cmp = pipeline_vs_tensor(LLAMA_3_8B, 4, NVLINK, 2048)
    s = 16_777_216
    assert (cmp.tensor_transfers, cmp.pipeline_transfers) == (64, 3)
    assert close(cmp.tensor_bytes, 384 * s) and cmp.pipeline_bytes == 3 * s
    assert close(cmp.tensor_bytes / cmp.pipeline_bytes, 128)
    assert close(cmp.pipeline_s, 3 * (5e-6 + s / 450e9))
    assert cmp.tensor_s == tp_prefill_cost(LLAMA_3_8B, 4, NVLINK, 2048).total_s
    assert cmp.pipeline_s < cmp.tensor_s / 20



def test_phase_cost_figure_stacks_latency_and_bandwidth():
    from shardlib.ui.costs_figures import phase_cost_figure

    decode, prefill = tp_decode_cost(LLAMA_3_8B, 2, NVLINK), tp_prefill_cost(LLAMA_3_8B, 2, NVLINK, 2048)
    fig = phase_cost_figure([decode, prefill])
    assert [round(y, 9) for y in fig.data[0].y] == [round(decode.latency_s * 1e3, 9), round(prefill.latency_s * 1e3, 9)]
    assert close(fig.data[1].y[1], prefill.bandwidth_s * 1e3)


def test_explorer_updates_and_offers_only_usable_shard_counts():
    from shardlib.ui.costs_widgets import tp_cost_explorer

    box = tp_cost_explorer(list(LINKS.values()), tp=3, prompt_tokens=5000, batch=0)
    link, shards, prompt, batch, charge, text, fig, feedback = box.children
    assert list(shards.options) == [2, 4, 8, 16, 32] and shards.value in (2, 4)  # clamped to a usable degree
    assert prompt.value == 4096 and batch.value == 1  # clamped to the nearest choice
    link.value, shards.value, prompt.value = "Ethernet 100 Gb/s", 8, 2048
    expected = tp_prefill_cost(LLAMA_3_8B, 8, ETHERNET_100G, 2048, latency_charge="per_call")
    assert f"{expected.total_s * 1e3:,.2f} ms" in text.value and "bandwidth-bound" in text.value
    assert close(fig.figure.data[1].y[1], expected.bandwidth_s * 1e3)
    assert "each paying 1 latency (one per call)" in text.value
    charge.value = "per_step"
    assert "each paying 14 latencies (one per ring step)" in text.value
    assert "bandwidth-bound from" not in text.value  # the crossover is the learner's to find, by moving the batch
    for value in (1, 256):
        batch.value = value
        bound = tp_decode_cost(LLAMA_3_8B, 8, ETHERNET_100G, value, "per_step").bound
        assert f"{bound}-bound" in text.value.split("decode step")[1].split("<br>")[0]
    assert "model: alpha-beta" in fig.figure.layout.title.text  # a GPU link's figure says it is a model
    mine = tp_cost_explorer([Link("this machine", 1e9, 1e-4)])
    assert "this machine's fitted figures" in mine.children[6].figure.layout.title.text


def test_latency_throughput_figure_draws_the_planners_points():
    from shardlib.facts.hardware import H100_80GB
    from shardlib.predict.serving.memory import Workload
    from shardlib.predict.serving.replicas import latency_vs_throughput
    from shardlib.ui.costs_figures import latency_throughput_figure

    short = latency_vs_throughput(LLAMA_3_8B, H100_80GB, workload=Workload(context_tokens=1024, prompt_tokens=512))
    big = latency_vs_throughput(LLAMA_3_70B, H100_80GB)
    fig = latency_throughput_figure({"8B": short, "70B": big})
    eight, seventy = fig.data
    by_label = {p.label: p for p in short}
    # replicas once (every count of them is the same point per GPU), then tp = 2, 4, 8
    assert list(eight.text) == ["replicas", "tp = 2", "tp = 4", "tp = 8"]
    assert close(eight.x[0], by_label["2 replicas"].latency_alone_s * 1e3)
    assert close(eight.y[3], by_label["tp = 8"].tokens_per_s_per_gpu)
    assert list(seventy.text) == ["tp = 2", "tp = 4", "tp = 8"]  # 70B fits no single GPU: no replicas
    assert list(eight.x) == sorted(eight.x, reverse=True)  # each split answers sooner


@pytest.mark.parametrize("call, words", [
    (lambda: tp_decode_cost(LLAMA_3_8B, 0, NVLINK), "tp must be a whole number of at least 1, got 0"),
    (lambda: tp_decode_cost(LLAMA_3_8B, 3, NVLINK), "8 KV heads cannot be shared by 3 devices"),
    (lambda: tp_prefill_cost(LLAMA_3_8B, 2, NVLINK, 0), "prompt_tokens must be a whole number of at least 1, got 0"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# -- one implementation: the planner's stages and the replicas' pairs ---------------------------------------
def test_tp_all_reduces_by_hand():
    # Llama-3-8B, 2 layers, 3 tokens at tp = 4 over NVLink, per call: 4 all-reduces of 3 x 4096 x 2 = 24,576
    # bytes, each 5 us + 1.5 x 24576 / 450e9
    reduces = tp_all_reduces(LLAMA_3_8B.d_model, LLAMA_3_8B.bytes_per_param, 2, 4, NVLINK, 3)
    assert (reduces.collectives, reduces.size_bytes) == (4, 24_576)
    assert close(reduces.total_s, 4 * (5e-6 + 1.5 * 24_576 / 450e9))
    assert close(reduces.latency_s, 4 * 5e-6) and close(reduces.bandwidth_s, 4 * 1.5 * 24_576 / 450e9)
    # one shard: nothing to reduce
    assert tp_all_reduces(LLAMA_3_8B.d_model, LLAMA_3_8B.bytes_per_param, 32, 1, NVLINK, 3).total_s == 0.0
    # where experts take the MLP's place, one per layer
    assert tp_all_reduces(LLAMA_3_8B.d_model, LLAMA_3_8B.bytes_per_param, 2, 4, NVLINK, 3,
                          per_layer=1).collectives == 2


def test_the_planners_stage_prices_its_tp_all_reduces_with_the_tables_function():
    """The serving planner's stage and the chapter's table price a TP all-reduce the same way: a change
    to one is a change to the other."""
    from shardlib.core.mesh import Layout
    from shardlib.facts.hardware import H100_80GB, gpu_cluster
    from shardlib.predict.serving.decode import stage_costs

    cluster = gpu_cluster(H100_80GB, 1, 8)
    (stage,) = stage_costs(LLAMA_3_8B, cluster, Layout(8, 1, 1), 4, 1, 0.0)
    table = tp_decode_cost(LLAMA_3_8B, 8, cluster.intra_link, batch=4, latency_charge=cluster.latency_charge)
    assert stage.collectives == table.collectives == 64
    assert close(stage.comm_s, table.total_s)


def test_the_replicas_pairs_are_replicas_vs_tensor_parallel():
    """``latency_vs_throughput``'s pairs are ``replicas.replicas_vs_tensor_parallel`` of the planner's
    scores: the replicas' step, the split copy's compute and all-reduces, each at its own batch."""
    from dataclasses import replace

    from shardlib.core.mesh import Layout
    from shardlib.facts.hardware import H100_80GB, gpu_cluster
    from shardlib.predict.serving.decode import score
    from shardlib.predict.serving.memory import Workload
    from shardlib.predict.serving.replicas import latency_vs_throughput, replicas_vs_tensor_parallel

    workload = Workload(context_tokens=1024, prompt_tokens=512)
    points = {p.label: p for p in latency_vs_throughput(LLAMA_3_8B, H100_80GB, degrees=(2,), workload=workload)}
    cluster = gpu_cluster(H100_80GB, 1, 2)

    def pair(work):
        rep, split = (score(LLAMA_3_8B, cluster, lay, work) for lay in (Layout(1, 1, 2), Layout(2, 1, 1)))
        (stage,) = split.stages  # pp = 1: one stage, no hops
        return replicas_vs_tensor_parallel(rep.decode_step_s, stage.comm_s, 2, rep.batch,
                                           tp_compute_s=max(stage.read_s, stage.compute_s),
                                           tp_tokens_per_step=split.batch)

    loaded = pair(workload)
    assert loaded.tokens_per_step == points["2 replicas"].batch and loaded.tp_batch == points["tp = 2"].batch
    assert loaded.replicas_tokens_per_s == points["2 replicas"].tokens_per_s
    assert loaded.tp_tokens_per_s == points["tp = 2"].tokens_per_s
    assert loaded.latency_ratio == points["tp = 2"].latency_s / points["2 replicas"].latency_s < 1  # tp answers sooner
    alone = pair(replace(workload, batch=1))
    assert (alone.tokens_per_step, alone.tp_batch) == (1, 1)
    assert alone.tp_step_s == points["tp = 2"].latency_alone_s
    big = {p.label: p for p in latency_vs_throughput(LLAMA_3_70B, H100_80GB, degrees=(2,))}
    assert not big["2 replicas"].feasible  # 70B fits no single GPU: no replicas
