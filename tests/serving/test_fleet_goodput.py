"""Goodput, SLO attainment and the two pools predicted: hand-made metrics and a step cost whose every
number is chosen, so each figure can be worked out by hand."""

from __future__ import annotations

from collections import deque

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.serving.disagg import admit_handed_off
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.core.serving.scheduler import Scheduler
from shardlib.facts.hardware import Link
from shardlib.predict.serving.engine import StepCost, simulate_serving
from shardlib.predict.serving.goodput import RequestMetrics, ServingObjective, goodput, slo_attainment
from shardlib.predict.serving.pools import handoff_s, simulate_pools

MODEL = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)


def m(ttft_s, tpot_s):
    return RequestMetrics(0.0, ttft_s, tpot_s, ttft_s + 10 * tpot_s, tpot_s, 0)


OBJ = ServingObjective(ttft_s=0.2, tpot_s=0.05, share=0.9)


def test_slo_attainment_counts_requests_meeting_both():
    metrics = [m(0.1, 0.01), m(0.3, 0.01), m(0.1, 0.06), m(0.2, 0.05), m(0.1, 0.0)]  # 2nd: TTFT, 3rd: TPOT
    assert slo_attainment(metrics, OBJ) == 3 / 5
    assert slo_attainment({i: x for i, x in enumerate(metrics)}, OBJ) == 3 / 5  # a dict by request id too


def test_goodput_is_the_highest_rate_meeting_the_share_per_gpu():
    good, bad = [m(0.1, 0.01)] * 10, [m(0.1, 0.01)] * 8 + [m(0.5, 0.01)] * 2  # 100 % and 80 %
    ninety = [m(0.1, 0.01)] * 9 + [m(0.5, 0.01)]  # exactly 90 %: meets a share of 0.9
    table = {1.0: good, 2.0: good, 4.0: ninety, 8.0: bad}
    assert goodput(table, OBJ) == 4.0
    assert goodput(table, OBJ, gpus=2) == 2.0  # per GPU
    assert goodput({**table, 16.0: good}, OBJ) == 4.0  # a lucky high rate past a miss does not count
    assert goodput({1.0: bad}, OBJ) == 0.0
    assert goodput(table, ServingObjective(0.2, 0.05, share=0.75)) == 8.0


@pytest.mark.parametrize("kwargs, message", [
    (dict(ttft_s=0, tpot_s=0.1), "ttft_s must be a positive number"),
    (dict(ttft_s=0.1, tpot_s=-1), "tpot_s must be a positive number"),
    (dict(ttft_s=0.1, tpot_s=0.1, share=1.5), "share must be a fraction"),
    (dict(ttft_s=0.1, tpot_s=0.1, share=0), "share must be a fraction"),
])
def test_an_objective_that_means_nothing_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServingObjective(**kwargs)


def test_goodput_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="at least one request rate"):
        goodput({}, OBJ)
    with pytest.raises(ValueError, match="gpus must be a whole number"):
        goodput({1.0: [m(0.1, 0.01)]}, OBJ, gpus=0)
    with pytest.raises(ValueError, match="request rates must be a positive number"):
        goodput({0.0: [m(0.1, 0.01)]}, OBJ)
    with pytest.raises(ValueError, match="at least one request"):
        slo_attainment([], OBJ)


# -- the pools, on a step cost of chosen numbers ---------------------------------------------------------
COST = StepCost(overhead_s=1.0, per_token_s=0.1, per_key_s=0.0, n_layers=2, d_model=32, element_bytes=8)
LINK = Link("test link", bandwidth_bytes_per_s=1e3, latency_s=0.5)  # 1 kB/s: the hand-off is seconds long
CONFIG = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)


def test_handoff_whole_and_layer_by_layer():
    assert handoff_s(2000, LINK, n_layers=2, layerwise=False, prefill_s=1.0) == pytest.approx(2.5)
    # layer by layer: the first layer's bytes travel under the second layer's compute (half of 1 s)
    assert handoff_s(2000, LINK, n_layers=2, layerwise=True, prefill_s=1.0) == pytest.approx(2.0)
    # a long prefill hides all but the last layer's share
    assert handoff_s(2000, LINK, n_layers=2, layerwise=True, prefill_s=100.0) == pytest.approx(1.25)


def test_one_request_through_the_pools_by_hand():
    r = Request(0, list(range(1, 11)), 4)  # 10 prompt tokens, 4 new
    pred = simulate_pools([r], CONFIG, COST, LINK, MODEL)
    first_s = 1.0 + 0.1 * 10  # one prefill step of 10 tokens
    kv_bytes = 2 * 2 * 2 * 8 * 8 * 10  # 2 (K, V) x layers x KV heads x head_dim x 8 bytes x 10 tokens
    wait = 0.5 + kv_bytes / 1e3
    assert pred.handoff_s[0] == pytest.approx(wait)
    decode = 1.0 + 0.1  # a decode step of one token
    assert pred.token_times_s[0] == pytest.approx((first_s, first_s + wait + decode, first_s + wait + 2 * decode,
                                                   first_s + wait + 3 * decode))
    assert pred.prefill_step_s == pytest.approx((first_s,)) and len(pred.decode_step_s) == 3
    assert pred.admitted_s[0] == pytest.approx(wait)  # nothing else decoding: admitted as the K/V land
    layerwise = simulate_pools([r], CONFIG, COST, LINK, MODEL, layerwise=True)
    assert layerwise.handoff_s[0] == pytest.approx(max(wait / 2, wait - first_s / 2))
    assert layerwise.token_times_s[0][1] < pred.token_times_s[0][1]  # the hidden part came off the wait


def test_pools_of_different_sizes_wait_for_the_busiest_rank():
    """1 + 2: the prefill rank sends both KV heads (one to each decode rank); 2 + 1: the decode rank receives
    both; 2 + 2: each rank moves one head. The busiest rank's bytes set the wait."""
    r = Request(0, list(range(1, 11)), 4)
    kv_bytes = 2 * 2 * 2 * 8 * 8 * 10  # both KV heads, as in the hand-worked request above
    for p, d, busiest in [(1, 1, kv_bytes), (1, 2, kv_bytes), (2, 1, kv_bytes), (2, 2, kv_bytes // 2)]:
        pred = simulate_pools([r], CONFIG, COST, LINK, MODEL, prefill_ranks=p, decode_ranks=d)
        assert pred.handoff_s[0] == pytest.approx(0.5 + busiest / 1e3)
    assert simulate_pools([r], CONFIG, COST, LINK, MODEL, 2).handoff_s[0] == pytest.approx(0.5 + kv_bytes / 2e3)


def test_the_pools_and_the_colocated_engine_agree_on_a_free_link_and_no_overlap():
    """Requests far apart, a link that costs nothing: each request sees the same steps either way (a
    prefill, then its decodes), so the two predictions agree token for token."""
    free = Link("free", 1e30, 0.0)
    requests = [Request(i, list(range(1, 6 + i)), 3, arrival_s=100.0 * i) for i in range(3)]
    pools = simulate_pools(requests, CONFIG, COST, free, MODEL)
    colocated = simulate_serving(requests, CONFIG, COST)
    for r in requests:
        assert pools.token_times_s[r.request_id] == pytest.approx(colocated.token_times_s[r.request_id])


def test_a_one_token_request_is_done_at_the_prefill_and_hands_nothing_off():
    pred = simulate_pools([Request(0, [1, 2, 3], 1), Request(1, [4, 5], 2)], CONFIG, COST, LINK, MODEL)
    assert 0 not in pred.handoff_s and 1 in pred.handoff_s
    assert len(pred.token_times_s[0]) == 1 and len(pred.token_times_s[1]) == 2


def test_the_decode_pool_admits_while_its_cache_and_max_num_seqs_allow():
    requests = [Request(i, [1] * 12, 4) for i in range(3)]  # 12 tokens: 3 blocks of 4 each
    config = EngineConfig(block_size=4, num_blocks=7, max_batch_tokens=16)
    sched = Scheduler(config)
    handed = deque((i, 7, 0.5) for i in range(3))
    admits = admit_handed_off(sched, handed, requests, config)
    assert [i for i, _ in admits] == [0, 1] and len(handed) == 1  # 6 of 7 blocks: the third waits
    assert all(len(table) == 3 for _, table in admits)
    seq = sched.running[0]
    assert seq.computed == 12 and seq.output == [7] and seq.token_times_s == [0.5]
    capped = EngineConfig(block_size=4, num_blocks=64, max_batch_tokens=16, max_num_seqs=1)
    sched = Scheduler(capped)
    assert len(admit_handed_off(sched, deque((i, 7, 0.5) for i in range(3)), requests, capped)) == 1
