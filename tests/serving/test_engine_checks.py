"""What notebook 06 calls: the reference tokens and their margin, the policy check, the replay's counts,
and the engine's figures and explorer. Exact parts only: no timing is asserted here."""

from __future__ import annotations

import pytest
import torch

from shardlib.core.config import ModelConfig
from shardlib.core.model import forward_reference, greedy_reference, random_weights
from shardlib.core.serving.requests import EngineConfig, Request
from shardlib.lab.serving.engine_drivers import reference_tokens, run_policy_check
from shardlib.lab.serving.traces import poisson_trace, shared_prefix_trace
from shardlib.predict.serving.engine import StepCost, figures, simulate_serving
from shardlib.ui.serving_tables import served_table

MODEL = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
COST = StepCost(0.004, 2e-5, 1e-8, n_layers=2, d_model=32, element_bytes=8)


@pytest.fixture(scope="module")
def weights():
    return random_weights(MODEL, seed=0, dtype=torch.float64)


def test_reference_tokens_are_greedy_and_the_margin_is_the_smallest_top_two_gap(weights):
    requests = poisson_trace(3, float("inf"), prompt_tokens=(3, 9), new_tokens=(2, 5), seed=4)
    tokens, margin = reference_tokens(weights, requests)
    gaps = []
    for r in requests:
        assert tokens[r.request_id] == greedy_reference(weights, r.prompt_token_ids, r.max_new_tokens)
        full = torch.tensor(r.prompt_token_ids + tokens[r.request_id])
        logits = forward_reference(weights, full)[len(r.prompt_token_ids) - 1:-1]  # the logits each token came from
        top2 = logits.topk(2, dim=-1).values
        gaps.append(float((top2[:, 0] - top2[:, 1]).min()))
    assert margin == pytest.approx(min(gaps), rel=1e-9) and margin > 1e-9  # rows of another count: last bits move


def test_the_replay_counts_preemptions_and_prefix_hits():
    trace = poisson_trace(10, float("inf"), prompt_tokens=(4, 40), new_tokens=(2, 24), seed=1)
    assert simulate_serving(trace, EngineConfig(block_size=8, num_blocks=64), COST).preemptions == 0
    assert simulate_serving(trace, EngineConfig(block_size=8, num_blocks=12), COST).preemptions > 0
    chats = shared_prefix_trace(conversations=3, turns=3, system_tokens=32, gap_s=0.05, seed=5)
    on = simulate_serving(chats, EngineConfig(block_size=8, num_blocks=64), COST)
    off = simulate_serving(chats, EngineConfig(block_size=8, num_blocks=64, prefix_caching=False), COST)
    assert on.prefix_hit_rate > 0.3 and off.prefix_hit_rate == 0.0


def test_the_longest_gap_is_the_largest_wait_between_two_tokens_of_one_request():
    requests = [Request(i, [1], 3) for i in range(2)]
    f = figures(requests, {0: (0.1, 0.2, 0.6), 1: (0.2, 0.3, 0.4)})
    assert f["gap_max_s"] == pytest.approx(0.4)


def test_the_policy_check_serves_every_policy_and_predicts_with_the_given_cost(weights, pool2):
    trace = poisson_trace(6, float("inf"), prompt_tokens=(4, 20), new_tokens=(2, 8), seed=3)
    policies = {"continuous": EngineConfig(block_size=8, num_blocks=32, max_batch_tokens=32, max_num_seqs=2),
                "static": EngineConfig(block_size=8, num_blocks=32, max_batch_tokens=32, max_num_seqs=2,
                                       batching="static")}
    check = run_policy_check(pool2, weights, trace, policies, cost=COST)
    reference, _ = reference_tokens(weights, trace)
    assert set(check.runs) == set(policies) and all(run.tokens == reference for run in check.runs.values())
    for name, policy in policies.items():
        replay = simulate_serving(trace, policy, COST)
        assert check.predicted[name] == {"hit_rate": replay.prefix_hit_rate, **replay.figures(trace)}
    assert check.cost is COST and check.verdicts == ()
    table = served_table(check, ("tokens_per_s",))
    assert "continuous" in table and "static" in table and "tokens/s" in table


def test_the_policy_check_refuses_unknown_claims_and_a_missing_cost(weights, pool2):
    trace = poisson_trace(2, float("inf"), prompt_tokens=(4, 8), new_tokens=(2, 3), seed=3)
    policies = {"a": EngineConfig(block_size=8, num_blocks=16)}
    with pytest.raises(ValueError, match="figures are"):
        run_policy_check(pool2, weights, trace, policies, cost=COST, claims=[("speed", "a")])
    with pytest.raises(ValueError, match="figures are"):
        run_policy_check(pool2, weights, trace, policies, cost=COST, ratios=[("tokens_per_s", "a", "b")])
    with pytest.raises(ValueError, match="give a step cost"):
        run_policy_check(pool2, weights, trace, policies)


def test_the_timeline_draws_a_wait_bar_and_a_dot_per_token():
    from shardlib.ui.engine_figures import kv_use_figure, token_timeline_figure

    requests = [Request("a", [1, 2], 2, arrival_s=0.0), Request("b", [3], 3, arrival_s=0.01)]
    fig = token_timeline_figure(requests, {"a": (0.02, 0.03), "b": (0.03, 0.04, 0.05)}, where="here")
    wait, dots = fig.data
    assert list(wait.y) == ["request a", "request b"] and [round(x, 6) for x in wait.x] == [20.0, 20.0]
    assert len(dots.x) == 5 and round(dots.x[-1], 6) == 50.0 and "here" in fig.layout.title.text
    with pytest.raises(ValueError, match="no token times"):
        token_timeline_figure(requests, {})
    bars = kv_use_figure(0.9, 0.3, (0.204, 0.382)).data[0]
    assert [round(y, 6) for y in bars.y] == [90.0, 30.0, 29.3]


def test_the_explorer_replays_the_scheduler_and_refuses_what_cannot_run():
    from shardlib.ui.engine_widgets import engine_explorer, explorer_state

    requests, config, predicted = explorer_state(COST, float("inf"), 16, 64, True)
    assert config.num_blocks == 512 // 16 and predicted.token_times_s == simulate_serving(
        requests, config, COST).token_times_s
    with pytest.raises(ValueError, match="max_batch_tokens = 16"):
        explorer_state(COST, 20.0, 16, 16, False)  # prefill-first: a whole prompt must fit one step
    box = engine_explorer(COST)
    assert "TTFT p50" in box.children[3].value
    (rate, block), (budget, chunked) = box.children[0].children, box.children[1].children
    for control, other in ((rate, 50.0), (block, 32), (budget, 128), (chunked, False)):
        before = box.children[3].value
        control.value = other
        assert box.children[3].value != before, f"moving {control.description or 'the toggle'} changed nothing shown"
