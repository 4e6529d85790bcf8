"""The pure cost models against numbers worked by hand (the working is in the comments), their limits,
the chapter's two lessons, and the figures and the explorer widget drawn from them."""

import math

import pytest

from shardlib.costs import (
    algorithm_bandwidth,
    all_reduce_s,
    all_to_all_s,
    bus_bandwidth,
    collective_terms_s,
    collective_time_s,
    cost_terms,
    crossover_bytes,
    decode_crossover_batch,
    decode_step_compute_s,
    fits_on_device,
    format_tp_cost_table,
    pipeline_vs_tensor,
    point_to_point_s,
    replicas_vs_tensor_parallel,
    tp_cost_table,
    tp_decode_cost,
    tp_prefill_cost,
)
from shardlib.hardware import ETHERNET_100G, LINKS, NVLINK, PCIE_GEN4, Link
from shardlib.models import LLAMA_3_8B, LLAMA_3_70B

# 1 GB/s each way, 10 us per message: easy numbers to work by hand
LINK = Link("test", 1e9, 1e-5)
MB = 1_000_000


def close(a, b):
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-18)


def test_ring_all_reduce_by_hand():
    # n = 4: 2(n-1) = 6 steps -> 6 x 10 us = 60 us; 2(n-1)/n = 1.5 -> 1.5 x 1 MB / 1 GB/s = 1.5 ms
    assert close(all_reduce_s(MB, 4, LINK), 60e-6 + 1.5e-3)
    # per call: the latency once -> 10 us + 1.5 ms
    assert close(all_reduce_s(MB, 4, LINK, "per_call"), 10e-6 + 1.5e-3)
    # n = 2: 2 steps, factor 1 -> 20 us + 1 ms
    assert close(all_reduce_s(MB, 2, LINK), 20e-6 + 1e-3)


def all_gather_s(size_bytes, world_size, link, latency_charge="per_step"):
    return collective_time_s("all_gather", size_bytes, world_size, link, latency_charge)


def reduce_scatter_s(size_bytes, world_size, link, latency_charge="per_step"):
    return collective_time_s("reduce_scatter", size_bytes, world_size, link, latency_charge)


@pytest.mark.parametrize("fn", [all_gather_s, reduce_scatter_s, all_to_all_s])
def test_gather_scatter_and_all_to_all_by_hand(fn):
    # n = 4: n-1 = 3 steps -> 30 us; (n-1)/n = 0.75 of 1 MB at 1 GB/s -> 0.75 ms
    assert close(fn(MB, 4, LINK), 30e-6 + 0.75e-3)
    # n = 8: 7 steps -> 70 us; 7/8 of 2 MB -> 1.75 ms
    assert close(fn(2 * MB, 8, LINK), 70e-6 + 1.75e-3)


def test_point_to_point_by_hand():
    # 10 us + 1 MB / 1 GB/s = 10 us + 1 ms
    assert close(point_to_point_s(MB, LINK), 10e-6 + 1e-3)


def test_an_aggregate_figure_is_halved_for_one_direction():
    both_ways = Link("both", 2e9, 1e-5, "aggregate")
    assert both_ways.one_way_bytes_per_s == 1e9
    assert close(all_reduce_s(MB, 4, both_ways), all_reduce_s(MB, 4, LINK))
    assert NVLINK.one_way_bytes_per_s == 450e9  # 900 GB/s both ways on the datasheet


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_one_rank_costs_nothing(op):
    assert cost_terms(op, 1) == (0, 0.0)
    assert collective_terms_s(op, MB, 1, LINK) == (0.0, 0.0)


@pytest.mark.parametrize("op, n", [("all_reduce", 2), ("all_reduce", 8), ("all_gather", 4), ("all_to_all", 3),
                                   ("point_to_point", 2)])
def test_doubling_the_bytes_doubles_the_bandwidth_term_only(op, n):
    latency, bandwidth = collective_terms_s(op, MB, n, LINK)
    latency2, bandwidth2 = collective_terms_s(op, 2 * MB, n, LINK)
    assert latency2 == latency and close(bandwidth2, 2 * bandwidth)


def test_bus_and_algorithm_bandwidth_by_hand():
    # 1 MB in 1 ms: algorithm bandwidth 1 GB/s; an all-reduce on 4 ranks moved 2(n-1)/n = 1.5x that
    assert close(algorithm_bandwidth(MB, 1e-3), 1e9)
    assert close(bus_bandwidth("all_reduce", MB, 1e-3, 4), 1.5e9)
    assert close(bus_bandwidth("all_gather", MB, 1e-3, 4), 0.75e9)
    assert close(bus_bandwidth("point_to_point", MB, 1e-3, 2), 1e9)
    # a collective running at the link's rate has a bus bandwidth equal to the link's (no latency)
    fast = Link("no latency", 1e9, 0.0)
    assert close(bus_bandwidth("all_reduce", 8 * MB, all_reduce_s(8 * MB, 8, fast), 8), 1e9)


def test_crossover_by_hand():
    # point-to-point: alpha x bandwidth = 10 us x 1 GB/s = 10,000 bytes
    assert close(crossover_bytes(LINK), 10_000)
    # ring all-reduce on 4: 6 alpha = 1.5 S / B  ->  S = 4 alpha B = 40,000 bytes
    assert close(crossover_bytes(LINK, "all_reduce", 4), 40_000)
    # and at that size the two parts are equal
    latency, bandwidth = collective_terms_s("all_reduce", 40_000, 4, LINK)
    assert close(latency, bandwidth)
    # NVLink: 5 us x 450 GB/s = 2.25 MB; a decode all-reduce (8 KiB) is far below it
    assert close(crossover_bytes(NVLINK), 2.25e6)


def test_every_preset_says_where_its_figures_come_from():
    for link in LINKS.values():
        assert link.direction in ("per direction", "aggregate")
        assert len(link.source) > 20 and len(link.latency_source) > 20
    assert "aggregate" == NVLINK.direction and "1 TB/s" in NVLINK.source
    assert LINKS["PCIe Gen4 x16"] is PCIE_GEN4


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


def test_replicas_against_tensor_parallel_by_hand():
    # 10 ms of compute per step of 4 tokens, 1 ms of communication, 2 devices:
    # replicas 2 x 4 / 10 ms = 800 tokens/s; TP 4 / (5 ms + 1 ms) = 666.7 tokens/s; ratio 1 + 2 x 1/10 = 1.2
    r = replicas_vs_tensor_parallel(10e-3, 1e-3, 2, 4)
    assert close(r.replicas_tokens_per_s, 800) and close(r.tp_tokens_per_s, 4 / 6e-3)
    assert close(r.throughput_ratio, 1.2)
    assert close(replicas_vs_tensor_parallel(10e-3, 0.0, 2, 4).throughput_ratio, 1.0)  # free comm: a tie
    # per device: 400 against 333.3 tokens/s; the latency per token is the step: 6 ms against 10 ms,
    # 1/n + comm / compute = 0.5 + 0.1 = 0.6
    assert close(r.replicas_tokens_per_s_per_device, 400) and close(r.tp_tokens_per_s_per_device, 4 / 6e-3 / 2)
    assert close(r.latency_ratio, 0.6)
    # communication that costs more than the half of the compute it saves: the split copy is slower too
    assert replicas_vs_tensor_parallel(10e-3, 6e-3, 2, 4).latency_ratio > 1


def test_memory_bound_decode_and_what_fits():
    # Llama-3-8B: 8.03e9 params x 2 bytes = 16.06 GB read per step at 3.35 TB/s = 4.79 ms
    assert close(decode_step_compute_s(LLAMA_3_8B, 3.35e12), LLAMA_3_8B.weight_bytes / 3.35e12)
    assert 4.7e-3 < decode_step_compute_s(LLAMA_3_8B, 3.35e12) < 4.9e-3
    # 70B: 141 GB does not fit one 80 GB GPU; split two ways it is 70.5 GB each
    assert not fits_on_device(LLAMA_3_70B, 80e9) and fits_on_device(LLAMA_3_70B, 80e9, 2)


@pytest.mark.parametrize("call, words", [
    (lambda: all_reduce_s(0, 4, LINK), "size_bytes must be a positive number, got 0"),
    (lambda: all_reduce_s(-5, 4, LINK), "size_bytes must be a positive number, got -5"),
    (lambda: all_reduce_s(MB, 0, LINK),
     r"world_size \(the ranks of the collective\) must be a whole number of at least 1, got 0"),
    (lambda: all_gather_s(MB, 2.5, LINK), "got 2.5"),
    (lambda: Link("x", 0, 1e-6), "x: bandwidth_bytes_per_s must be a positive number, got 0"),
    (lambda: Link("x", -1e9, 1e-6), "got -1000000000.0"),
    (lambda: Link("x", 1e9, -1e-6), r"latency_s \(seconds\) must be a number of at least 0, got -1e-06"),
    (lambda: Link("x", 1e9, 1e-6, "both"), "unknown x: direction 'both'"),
    (lambda: cost_terms("broadcast", 2), "unknown operation 'broadcast'"),
    (lambda: all_reduce_s(MB, 2, LINK, "sometimes"), "unknown latency_charge 'sometimes'"),
    (lambda: tp_decode_cost(LLAMA_3_8B, 0, NVLINK), "tp must be a whole number of at least 1, got 0"),
    (lambda: tp_decode_cost(LLAMA_3_8B, 3, NVLINK), "8 KV heads cannot be shared by 3 devices"),
    (lambda: tp_prefill_cost(LLAMA_3_8B, 2, NVLINK, 0), "prompt_tokens must be a whole number of at least 1, got 0"),
    (lambda: crossover_bytes(LINK, "all_reduce", 1), "moves nothing"),
    (lambda: replicas_vs_tensor_parallel(0, 1e-3, 2, 4), "step_compute_s must be a positive number, got 0"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# -- figures and the explorer -------------------------------------------------------------------------
def test_link_comparison_figure_draws_the_formula():
    from shardlib.ui.costs_figures import link_comparison_figure

    fig = link_comparison_figure([NVLINK, ETHERNET_100G], "all_reduce", 8, {"decode": 8192})
    line = fig.data[0]
    assert line.name == NVLINK.name
    assert close(line.y[0], all_reduce_s(line.x[0], 8, NVLINK) * 1e6)
    diamond = fig.data[1]
    assert close(diamond.x[0], crossover_bytes(NVLINK, "all_reduce", 8))
    assert len(fig.layout.shapes) == 1


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
    assert close(fig.data[1].y[1], expected.bandwidth_s * 1e3)
    assert "each paying 1 latency (one per call)" in text.value
    charge.value = "per_step"
    assert "each paying 14 latencies (one per ring step)" in text.value
    crossover = decode_crossover_batch(LLAMA_3_8B, 8, ETHERNET_100G, "per_step")
    assert f"bandwidth-bound from a batch of {crossover:,.0f} on" in text.value
    assert "model: alpha-beta" in fig.layout.title.text  # a GPU link's figure says it is a model
    mine = tp_cost_explorer([Link("this machine", 1e9, 1e-4)])
    assert "this machine's fitted figures" in mine.children[6].layout.title.text


def test_latency_throughput_figure_draws_the_planners_points():
    from shardlib.hardware import H100_80GB
    from shardlib.serving import Workload, latency_vs_throughput
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
