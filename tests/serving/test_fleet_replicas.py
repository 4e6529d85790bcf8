"""Replicas behind a router on real ranks: the tokens of every policy equal one process's, every request
is served by the replica the router chose, and a hot prefix piles up without a threshold (counted)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from shardlib.core.config import ModelConfig
from shardlib.core.model import random_weights
from shardlib.core.serving.requests import EngineConfig
from shardlib.core.serving.router import make_router
from shardlib.lab.serving.engine_drivers import reference_tokens, run_serving
from shardlib.lab.serving.replica_drivers import run_replicas, run_replicas_vs_tp_check, run_router_check
from shardlib.lab.serving.traces import hot_prefix_trace
from shardlib.predict.serving.engine import StepCost, simulate_serving
from shardlib.predict.serving.fleet import route_trace
from shardlib.ui.serving_tables import served_table

POLICIES = ("round-robin", "least-loaded", "prefix-aware")
CONFIG = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)


pytestmark = pytest.mark.usefixtures("one_thread")  # one torch thread here, as a rank has


@pytest.fixture(scope="module")
def weights():
    model = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                        max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    return random_weights(model, seed=0, dtype=torch.float64)


@pytest.fixture(scope="module")
def trace_and_reference(weights):
    requests = hot_prefix_trace(12, rate_per_s=400.0, hot=0.6, seed=1)
    tokens, margin = reference_tokens(weights, requests)
    assert margin > 1e-9  # far above float64 reordering: greedy tokens must be exact
    return requests, tokens


@pytest.mark.parametrize("policy", POLICIES)
def test_tokens_exact_for_every_policy_and_layout(pool, weights, trace_and_reference, policy):
    requests, reference = trace_and_reference
    for replicas in ([2] if pool.world_size == 2 else [4, 2]):  # 2 x 1; 4 x 1 and 2 x 2 (TP inside)
        run = run_replicas(pool, weights, requests, CONFIG, replicas=replicas, policy=policy)
        assert run.tokens == reference, (replicas, policy)
        assert run.tp == pool.world_size // replicas and len(run.replica_steps) == replicas
        assert set(run.replica_of) == set(reference) and set(run.replica_of.values()) <= set(range(replicas))
        assert sum(run.routed) == len(requests)
        assert all(m.ttft_s > 0 for m in run.metrics.values())  # one clock: no token before its request


@pytest.mark.parametrize("policy", POLICIES)
def test_each_replica_served_what_the_router_sent_it(pool4, weights, trace_and_reference, policy):
    """Each replica's prefix cache looked up exactly the prompts routed to it (no preemption here)."""
    requests, _ = trace_and_reference
    run = run_replicas(pool4, weights, requests, CONFIG, replicas=4, policy=policy)
    assert run.preemptions == 0
    looked_up = [sum(len(r.prompt_token_ids) for r in requests if run.replica_of[r.request_id] == k)
                 for k in range(4)]
    assert list(run.replica_lookup_tokens) == looked_up
    assert [len(s) > 0 for s in run.replica_steps] == [n > 0 for n in run.routed]
    if policy == "round-robin":  # loads do not matter: the replay routes the same way
        assert [run.replica_of[r.request_id] for r in requests] == route_trace(make_router(policy, 4), requests, 4)


def test_a_hot_prefix_piles_up_without_the_threshold(pool4, weights):
    requests = hot_prefix_trace(24, rate_per_s=float("inf"), hot=0.75, seed=2)
    hot = [r.request_id for r in requests if r.request_id.startswith("h")]
    pure = run_replicas(pool4, weights, requests, CONFIG, replicas=4, policy="prefix-aware", balance_threshold=None)
    kept = run_replicas(pool4, weights, requests, CONFIG, replicas=4, policy="prefix-aware", balance_threshold=2)
    first = pure.replica_of[hot[0]]
    assert all(pure.replica_of[h] == first for h in hot)  # every hot request on one replica
    assert pure.max_queued[first] >= len(hot)
    # the threshold keeps every queue within 2 of an even share: 24 requests at once, 6 a replica
    assert max(kept.max_queued) <= len(requests) // 4 + 2 < len(hot)
    assert max(kept.routed) - min(kept.routed) <= 3
    assert pure.prefix_hit_rate >= kept.prefix_hit_rate  # what the pile-up buys: more cache hits


def test_bad_input_is_refused_before_any_rank_starts(pool4, weights, trace_and_reference):
    requests, _ = trace_and_reference
    with pytest.raises(ValueError, match="3 replicas do not divide 4 ranks"):
        run_replicas(pool4, weights, requests, CONFIG, replicas=3)
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'.*'prefix-aware'"):
        run_replicas(pool4, weights, requests, CONFIG, replicas=2, policy="fastest")
    with pytest.raises(ValueError, match="balance_threshold"):
        run_replicas(pool4, weights, requests, CONFIG, replicas=2, policy="prefix-aware", balance_threshold=-1)
    with pytest.raises(ValueError, match="replicas must be a whole number"):
        run_replicas(pool4, weights, requests, CONFIG, replicas=0)
    assert run_replicas(pool4, weights, requests[:2], CONFIG, replicas=2).tokens  # the pool still serves


def test_router_check_predicts_the_routing_it_serves(pool4, weights):
    """Every request at once: the router decides before any step, so the replay routes exactly as the ranks."""
    requests = hot_prefix_trace(16, rate_per_s=float("inf"), seed=4)
    cost = StepCost(overhead_s=2e-3, per_token_s=1e-4, per_key_s=0.0, n_layers=2, d_model=32, element_bytes=8)
    policies = {"round-robin": "round-robin", "least-loaded": "least-loaded",
                "prefix-aware, no threshold": ("prefix-aware", {"balance_threshold": None})}
    check = run_router_check(pool4, weights, requests, CONFIG, policies, cost=cost, claims=())
    for label in policies:
        assert check.runs[label].replica_of == check.simulated[label].replica_of, label
    assert list(check.runs) == list(policies) and check.verdicts == ()
    lines = served_table(check, ("hit_rate", "tokens_per_s")).splitlines()  # heads, figures, routed
    assert len(lines) == 2 + 2 + 1 and lines[-1].startswith("routed")
    with pytest.raises(ValueError, match="figures are"):
        run_router_check(pool4, weights, requests, CONFIG, cost=cost, claims=[("speed", "round-robin")])
    with pytest.raises(ValueError, match="give a step cost"):
        run_router_check(pool4, weights, requests, CONFIG)


@pytest.mark.parametrize("replicas", [4, 2])
def test_replicas_and_the_split_copy_serve_the_same_tokens(pool4, weights, trace_and_reference, replicas):
    requests, reference = trace_and_reference
    check = run_replicas_vs_tp_check(pool4, weights, requests, CONFIG, requests[:6], replicas=replicas, ratios=())
    assert check.replicas_run.tokens == check.tp_run.tokens == reference
    assert check.tp_run.tp == 4 and check.replicas_run.tp == 4 // replicas and check.verdicts == ()
    assert (check.planner is not None) == (replicas == 4)  # the planner's pair: n replicas against tp = n
    if check.planner is not None:
        assert check.planner.world_size == 4 and check.planner.replica_step_s == pytest.approx(
            check.cost[0].step_s(check.planner.tokens_per_step, 0))
    assert tuple(check.runs) == ((f"{replicas} replicas" + ("" if replicas == 4 else " x tp 2")), "tp = 4")
    assert len(served_table(check).splitlines()) == 2 + 4  # two heads, then TTFT p50 and p90, TPOT p50, tokens/s
    with pytest.raises(ValueError, match="ratios name"):
        run_replicas_vs_tp_check(pool4, weights, requests, CONFIG, requests, ratios=("hit_rate",))


def test_replicas_against_the_split_copy_on_costs_fitted_before(pool4, weights, trace_and_reference):
    requests, reference = trace_and_reference
    costs = (StepCost(2e-3, 1e-4, 0.0, 2, 32, 8), StepCost(9e-3, 1e-4, 0.0, 2, 32, 8))
    check = run_replicas_vs_tp_check(pool4, weights, requests, CONFIG, costs=costs, ratios=())
    assert check.replicas_run.tokens == check.tp_run.tokens == reference
    assert check.cost == costs  # used as given: no fit run
    assert check.simulated["tp = 4"].token_times_s == simulate_serving(requests, CONFIG, costs[1]).token_times_s
    with pytest.raises(ValueError, match="not both or neither"):
        run_replicas_vs_tp_check(pool4, weights, requests, CONFIG, requests, costs=costs)
    with pytest.raises(ValueError, match="not both or neither"):
        run_replicas_vs_tp_check(pool4, weights, requests, CONFIG)
    with pytest.raises(ValueError, match="two StepCosts"):
        run_replicas_vs_tp_check(pool4, weights, requests, CONFIG, costs=costs[:1])


def test_seeded_requests_sample_the_same_tokens_on_replicas(pool2, weights):
    """A request's seed travels with it to its replica: the draws do not depend on where it ran."""
    requests = [replace(r, seed=i) for i, r in enumerate(hot_prefix_trace(8, rate_per_s=float("inf"), seed=6))]
    alone = run_serving(pool2, weights, requests, CONFIG)
    spread = run_replicas(pool2, weights, requests, CONFIG, replicas=2, policy="round-robin")
    assert spread.tokens == alone.tokens and set(spread.routed) == {4}
