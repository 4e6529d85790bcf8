"""A prefill : decode split of engines predicted on a step cost: one engine each way first-tokens as the
engine alone, round robin deals the requests, and bad splits are refused in words."""

from __future__ import annotations

from dataclasses import replace

import pytest

from shardlib.core.config import ModelConfig
from shardlib.core.serving.requests import EngineConfig
from shardlib.lab.serving.disagg import LOOPBACK
from shardlib.lab.serving.traces import poisson_trace
from shardlib.predict.serving.engine import StepCost, simulate_serving
from shardlib.predict.serving.goodput import ServingObjective
from shardlib.predict.serving.pools import simulate_colocated, simulate_pools, split_figures

MODEL = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
COST = StepCost(8e-3, 3e-4, 2e-6, 2, 32, 8)
CONFIG = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)


def trace_at(rate):
    return poisson_trace(16, rate, prompt_tokens=(4, 40), new_tokens=(2, 24), seed=7)


def test_one_engine_each_way_is_the_engine_alone():
    trace = trace_at(100.0)
    firsts = simulate_serving([replace(r, max_new_tokens=1) for r in trace], CONFIG, COST).token_times_s
    pools = simulate_pools(trace, CONFIG, COST, LOOPBACK, MODEL)
    assert {rid: times[0] for rid, times in pools.token_times_s.items()} == {rid: t[0] for rid, t in firsts.items()}
    assert simulate_colocated(trace, CONFIG, COST, 1) == simulate_serving(trace, CONFIG, COST).token_times_s


def test_round_robin_deals_the_requests_over_the_engines():
    trace = trace_at(100.0)
    colocated = simulate_colocated(trace, CONFIG, COST, 2)
    assert colocated == {**simulate_serving(trace[0::2], CONFIG, COST).token_times_s,
                         **simulate_serving(trace[1::2], CONFIG, COST).token_times_s}
    split = simulate_pools(trace, CONFIG, COST, LOOPBACK, MODEL, prefill_engines=2, decode_engines=1).token_times_s
    firsts = {**simulate_serving([replace(r, max_new_tokens=1) for r in trace[0::2]], CONFIG, COST).token_times_s,
              **simulate_serving([replace(r, max_new_tokens=1) for r in trace[1::2]], CONFIG, COST).token_times_s}
    assert {rid: times[0] for rid, times in split.items()} == {rid: t[0] for rid, t in firsts.items()}
    assert all(len(split[r.request_id]) == r.max_new_tokens for r in trace)


def test_split_figures_read_goodput_over_the_sweep():
    tight, loose = ServingObjective(0.2, 0.009, 0.9, "tight"), ServingObjective(0.2, 0.05, 0.9, "loose")
    sweep = tuple(25.0 * 2 ** k for k in range(6))
    for split in (None, (1, 3), (2, 2)):
        f = split_figures(trace_at, 100.0, sweep, CONFIG, COST, LOOPBACK, MODEL, 4, split, (tight, loose))
        assert f.goodput_per_engine["loose"] >= f.goodput_per_engine["tight"]
        assert [rate for rate, _ in f.swept["loose"]] == list(sweep)
        assert f.goodput_per_engine["loose"] in {0.0} | {rate / 4 for rate in sweep}
        assert f.label == ("colocated" if split is None else f"{split[0]} prefill : {split[1]} decode")


def test_bad_splits_are_refused_in_words():
    with pytest.raises(ValueError, match="at least one to prefill and one to decode, summing to 4; got 0 : 4"):
        split_figures(trace_at, 100.0, (100.0,), CONFIG, COST, LOOPBACK, MODEL, 4, (0, 4))
    with pytest.raises(ValueError, match="summing to 4; got 2 : 3"):
        split_figures(trace_at, 100.0, (100.0,), CONFIG, COST, LOOPBACK, MODEL, 4, (2, 3))
    with pytest.raises(ValueError, match="decode_engines"):
        simulate_pools(trace_at(100.0), CONFIG, COST, LOOPBACK, MODEL, decode_engines=0)
    with pytest.raises(ValueError, match="ServingObjective"):
        split_figures(trace_at, 100.0, (100.0,), CONFIG, COST, LOOPBACK, MODEL, 4, None, (0.1,))
