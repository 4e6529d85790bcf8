"""Replicas and router replayed on a step cost: one replica is the engine's own replay, and a hot prefix
piles up on one replica without the threshold."""

from __future__ import annotations

import pytest

from shardlib.core.serving.requests import EngineConfig
from shardlib.core.serving.router import make_router
from shardlib.lab.serving.traces import hot_prefix_trace
from shardlib.predict.serving.engine import StepCost, simulate_serving
from shardlib.predict.serving.fleet import route_trace, simulate_replicas

COST = StepCost(overhead_s=2e-3, per_token_s=1e-4, per_key_s=0.0, n_layers=2, d_model=32, element_bytes=8)
CONFIG = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64, max_num_seqs=4)


def test_one_replica_is_the_engines_replay():
    requests = hot_prefix_trace(16, rate_per_s=300.0, seed=3)
    one = simulate_replicas(requests, CONFIG, COST, 1, "round-robin")
    alone = simulate_serving(requests, CONFIG, COST)
    assert one.token_times_s == alone.token_times_s
    assert one.hit_rate(requests) == pytest.approx(alone.prefix_hit_rate)
    assert one.figures(requests)["tokens_per_s"] == alone.figures(requests)["tokens_per_s"]


def test_round_robin_routes_as_the_replay_and_every_request_is_served():
    requests = hot_prefix_trace(16, rate_per_s=300.0, seed=3)
    sim = simulate_replicas(requests, CONFIG, COST, 4, "round-robin")
    assert [sim.replica_of[r.request_id] for r in requests] == route_trace(make_router("round-robin", 4), requests, 4)
    assert set(sim.token_times_s) == {r.request_id for r in requests}
    assert all(len(sim.token_times_s[r.request_id]) == r.max_new_tokens for r in requests)
    assert sum(sim.routed) == 16 and sim.rounds <= 6


def test_the_hot_prefix_piles_up_in_the_replay_and_the_threshold_fixes_it():
    requests = hot_prefix_trace(32, rate_per_s=400.0, hot=0.75, seed=0)
    pure = simulate_replicas(requests, CONFIG, COST, 4, "prefix-aware", balance_threshold=None)
    kept = simulate_replicas(requests, CONFIG, COST, 4, "prefix-aware", balance_threshold=2)
    hot = [r.request_id for r in requests if r.request_id.startswith("h")]
    assert len({pure.replica_of[h] for h in hot}) == 1
    assert max(kept.routed) < len(hot)
    p, k = pure.figures(requests), kept.figures(requests)
    assert p["ttft_p90_s"] > 2 * k["ttft_p90_s"]  # the one replica's queue: four requests at a time
    assert p["hit_rate"] > k["hit_rate"]  # what the pile-up buys
    assert k["tokens_per_s"] > p["tokens_per_s"]


def test_a_replica_sent_nothing_is_idle():
    requests = hot_prefix_trace(3, rate_per_s=float("inf"), hot=1.0, seed=0)
    sim = simulate_replicas(requests, CONFIG, COST, 4, "prefix-aware", balance_threshold=None)
    assert sim.routed == (3, 0, 0, 0) and sim.per_replica[1].step_s == ()
    with pytest.raises(ValueError, match="unknown routing policy"):
        simulate_replicas(requests, CONFIG, COST, 2, "nearest")
