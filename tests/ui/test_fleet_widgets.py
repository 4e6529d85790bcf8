"""Serving at scale's explorers: each control, moved to either end, changes what the explorer shows."""

from __future__ import annotations

from shardlib.core.config import ModelConfig
from shardlib.core.serving.requests import EngineConfig
from shardlib.predict.serving.engine import StepCost

MODEL = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                    max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
COST = StepCost(8e-3, 3e-4, 2e-6, 2, 32, 8)
CONFIG = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64)


def _moves_change_the_table(box, controls, table):
    for control in controls:
        values = [o[1] if isinstance(o, tuple) else o for o in control.options]
        for value in (values[0], values[-1]):
            if control.value == value:
                continue
            before = table.value
            control.value = value
            assert table.value != before, f"moving {control.description or 'the toggle'} to {value} changed nothing"
        assert box.children[2].value == "", box.children[2].value  # no error shown


def test_the_pools_explorer_answers_every_control():
    from shardlib.ui.fleet_widgets import pools_explorer, pools_state

    objective, found, rate = pools_state(COST, MODEL, 4.0, 4, 2, (2, 2), n_requests=12)
    assert list(found) == ["colocated", "2 prefill : 2 decode"] and rate > 0 and objective.share == 0.9
    box = pools_explorer(COST, MODEL, n_requests=12)
    assert "goodput per engine" in box.children[3].value
    (rate, split), (ttft, tpot) = box.children[0].children, box.children[1].children
    _moves_change_the_table(box, (rate, split, ttft, tpot), box.children[3])


def test_the_router_explorer_answers_every_control():
    from shardlib.ui.fleet_widgets import router_explorer, router_state

    requests, predicted = router_state(COST, CONFIG, "prefix-aware", -1, 1.0, n_requests=12)
    assert max(predicted.routed) == 12  # every request under one prompt, no threshold: one replica takes them all
    box = router_explorer(COST, CONFIG, n_requests=16)
    assert "prefix hit rate" in box.children[3].value
    policy, (threshold, hot) = box.children[0], box.children[1].children
    _moves_change_the_table(box, (policy, threshold, hot), box.children[3])
