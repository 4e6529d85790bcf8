"""A replica's cold start: the checkpoint round trip exactly, the measured start (it runs, its figures are
positive, its first token is the reference's, its claims hold through ``verified``), the burst at scale by hand."""

import pytest
import torch

from shardlib.core.config import ModelConfig
from shardlib.core.model import random_weights
from shardlib.facts.models import LLAMA_3_8B, LLAMA_3_70B
from shardlib.lab.serving.cold_start import load_checkpoint, run_cold_start_check, save_checkpoint
from shardlib.predict.serving.burst import (
    NETWORK_BLOCK,
    NVME_GEN4,
    STORAGE,
    Storage,
    burst_at_scale,
    warm_replicas_needed,
)
from shardlib.ui.serving_tables import cold_start_table

SMALL = ModelConfig("llama", vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                    max_positions=64, rope_theta=10000.0, rms_eps=1e-6, norm_float32=True)


def test_a_checkpoint_round_trips_exactly(tmp_path):
    weights = random_weights(SMALL, seed=4)
    size = save_checkpoint(weights, tmp_path / "w.pt")
    assert size > sum(t.numel() * 4 for t in (weights.embed, weights.head))
    loaded = load_checkpoint(tmp_path / "w.pt")
    assert loaded.config == weights.config
    assert torch.equal(loaded.embed, weights.embed) and torch.equal(loaded.head, weights.head)
    assert all(torch.equal(a[k], b[k]) for a, b in zip(loaded.layers, weights.layers) for k in a)


def test_a_cold_start_runs_and_is_predicted():
    """One attempt: its two claims (the read against the calibrated bandwidth, the whole against its parts)
    are the notebook's under nbval; here, what does not depend on the clock, and that the parts add up."""
    run = run_cold_start_check(attempts=1)  # about 35 MB of weights, what the notebook starts
    assert run.first_token == run.reference_token  # the replica serves the checkpoint's model
    for figure in (run.process_start_s, run.load_s, run.first_step_s, run.total_s, run.load_bandwidth_bytes_per_s):
        assert figure > 0
    assert run.total_s >= run.process_start_s + run.load_s + run.first_step_s
    assert abs(run.calibration_bytes - run.checkpoint_bytes) < 0.01 * run.checkpoint_bytes  # another file, as large
    assert [v.what.split(",")[0] for v in run.verdicts] == ["weights read from a 36 MB checkpoint",
                                                              "cold start"]
    assert "page cache" in cold_start_table(run) and "first step" in cold_start_table(run)


def test_bad_input_to_the_check_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="must be a ModelConfig"):
        run_cold_start_check(LLAMA_3_8B)
    with pytest.raises(ValueError, match="does not fit in 64 positions"):
        run_cold_start_check(SMALL, prompt_tokens=64)


def test_a_burst_at_scale_by_hand():
    wait = burst_at_scale(LLAMA_3_70B, NVME_GEN4, 20.0, 4.0, 2, process_start_s=30.0, first_step_s=10.0)
    assert wait.weight_bytes == LLAMA_3_70B.n_params * 2  # bf16
    assert wait.load_s == pytest.approx(LLAMA_3_70B.n_params * 2 / 7.45e9)  # about 19 s
    assert wait.cold_start_s == pytest.approx(40.0 + wait.load_s)
    assert (wait.replicas_needed, wait.replicas_short) == (5, 3)
    assert wait.wait_s == wait.cold_start_s
    assert wait.queued_requests == pytest.approx((20.0 - 2 * 4.0) * wait.cold_start_s)
    assert "5 replicas, 2 warm" in wait.line
    slow = burst_at_scale(LLAMA_3_70B, NETWORK_BLOCK, 20.0, 4.0, 2, process_start_s=30.0, first_step_s=10.0)
    assert slow.load_s == pytest.approx(wait.load_s * 7.45e9 / (1000 * 2 ** 20))
    shards = burst_at_scale(LLAMA_3_70B, NETWORK_BLOCK, 20.0, 4.0, 2, process_start_s=0, first_step_s=0, read_paths=8)
    assert shards.load_s == pytest.approx(slow.load_s / 8)


def test_enough_warm_replicas_wait_for_nothing():
    assert warm_replicas_needed(8.0, 4.0) == 2 and warm_replicas_needed(8.1, 4.0) == 3
    calm = burst_at_scale(LLAMA_3_8B, NVME_GEN4, 8.0, 4.0, 2, process_start_s=5.0, first_step_s=1.0)
    assert (calm.replicas_short, calm.wait_s, calm.queued_requests) == (0, 0.0, 0.0)
    assert "none waits" in calm.line


def test_every_storage_figure_names_its_source():
    assert all(s.source and s.read_bytes_per_s > 0 for s in STORAGE.values())
    with pytest.raises(ValueError, match="read_bytes_per_s"):
        Storage("tape", 0, "none")


@pytest.mark.parametrize("kwargs, message", [
    (dict(burst_rate_per_s=0), "burst_rate_per_s"),
    (dict(replica_rate_per_s=-1), "replica_rate_per_s"),
    (dict(warm_replicas=-1), "warm_replicas"),
    (dict(process_start_s=-1), "process_start_s"),
    (dict(storage="NVMe"), "must be a Storage"),
    (dict(model="Llama"), "must be a ModelConfig"),
])
def test_bad_burst_input_is_refused_in_words(kwargs, message):
    args = dict(model=LLAMA_3_70B, storage=NVME_GEN4, burst_rate_per_s=10.0, replica_rate_per_s=2.0,
                warm_replicas=1, process_start_s=1.0, first_step_s=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        burst_at_scale(**args)
