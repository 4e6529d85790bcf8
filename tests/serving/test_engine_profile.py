"""Where the engine's step spends its time: every second of the profile lands in a group, the shares add up to
one, and a function with no group of its own is charged to its callers' groups (so "other" stays small)."""

import pytest
import torch

from shardlib.core.config import ModelConfig
from shardlib.core.model import random_weights
from shardlib.core.serving.requests import EngineConfig
from shardlib.lab.serving.profile import PROFILE_GROUPS, profile_engine
from shardlib.lab.serving.traces import poisson_trace

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_engine_profile_accounts_for_every_second():
    model = ModelConfig("llama", vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                        max_positions=128, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)
    weights = random_weights(model, seed=0, dtype=torch.float64)
    trace = poisson_trace(8, 100.0, prompt_tokens=(4, 24), new_tokens=(2, 8), seed=1)
    p = profile_engine(weights, trace, EngineConfig(block_size=8, num_blocks=32, max_batch_tokens=32))
    assert p.tokens == sum(r.total_tokens - 1 for r in trace) and p.steps > 0 and p.wall_s > 0
    assert set(p.shares) == {*PROFILE_GROUPS, "other"} and sum(p.shares.values()) == pytest.approx(1.0)
    assert p.shares["attention"] > 0 and p.shares["linears"] > 0 and p.shares["paged read/write"] > 0
    assert len(p.lines()) == len(PROFILE_GROUPS) + 2
    assert p.shares["other"] < 0.05  # a function with no group of its own is charged to its callers' groups
