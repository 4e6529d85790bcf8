"""The alpha-beta model of one collective and replicas against tensor parallelism, against numbers worked
by hand (the working is in the comments), their limits, and the link figure drawn from them. A whole
forward pass priced (the chapter's two lessons, its table and explorer) is ``tests/serving/test_cost.py``."""

import math

import pytest

from shardlib.facts.hardware import ETHERNET_100G, LINKS, NVLINK, PCIE_GEN4, Link
from shardlib.predict.alpha_beta import (
    all_reduce_s,
    bus_bandwidth,
    collective_terms_s,
    collective_time_s,
    cost_terms,
    crossover_bytes,
    point_to_point_s,
)
from shardlib.predict.serving.replicas import replicas_vs_tensor_parallel

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


def all_to_all_s(size_bytes, world_size, link, latency_charge="per_step"):
    return collective_time_s("all_to_all", size_bytes, world_size, link, latency_charge)


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
    assert "aggregate" == NVLINK.direction and "900GB/s" in NVLINK.source and "datasheet" in NVLINK.source
    assert LINKS["PCIe Gen4 x16"] is PCIE_GEN4


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
    (lambda: crossover_bytes(LINK, "all_reduce", 1), "moves nothing"),
    (lambda: replicas_vs_tensor_parallel(0, 1e-3, 2, 4), "step_compute_s must be a positive number, got 0"),
])
def test_bad_input_names_the_value(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# -- figures -----------------------------------------------------------------------------------------------
def test_link_comparison_figure_draws_the_formula():
    from shardlib.ui.costs_figures import link_comparison_figure

    fig = link_comparison_figure([NVLINK, ETHERNET_100G], "all_reduce", 8, {"decode": 8192})
    line = fig.data[0]
    assert line.name == NVLINK.name
    assert close(line.y[0], all_reduce_s(line.x[0], 8, NVLINK) * 1e6)
    diamond = fig.data[1]
    assert close(diamond.x[0], crossover_bytes(NVLINK, "all_reduce", 8))
    assert len(fig.layout.shapes) == 1
