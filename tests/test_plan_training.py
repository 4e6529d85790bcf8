"""The training memory model, published figures reproduced, and the training planner (pure: no ranks)."""

from __future__ import annotations

import pytest

from shardlib.data_parallel import STATE_BYTES_MEGATRON, layer_activation_bytes
from shardlib.models import LLAMA_3_1_405B, LLAMA_3_8B
from shardlib.plan import Layout
from shardlib.plan.published import (
    ZERO_FIGURE_1_GB,
    activation_rows,
    deepspeed_zero3_estimate,
    megatron_rows,
    zero_figure_rows,
)
from shardlib.plan.training_memory import in_flight, peak_training_memory, stage_params, training_memory


# -- layer_activation_bytes: Korthikanti et al. 2022, Table 2, each case by hand ---------------------------
@pytest.mark.parametrize("t", [2, 8])
def test_layer_activation_bytes_each_case_by_hand(t):
    model = LLAMA_3_8B  # h = 4096, a = 32
    s, b, h, a = 2048, 2, 4096, 32
    sbh = s * b * h
    assert layer_activation_bytes(model, s, b, "none") == sbh * (34 + 5 * a * s / h)
    assert layer_activation_bytes(model, s, b, "none", tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert layer_activation_bytes(model, s, b, "none", tp=t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * a * s / h))
    assert layer_activation_bytes(model, s, b, "selective", tp=t) == pytest.approx(sbh * (10 + 24 / t))
    assert layer_activation_bytes(model, s, b, "selective", tp=t, sequence_parallel=True) == pytest.approx(34 * sbh / t)
    assert layer_activation_bytes(model, s, b, "full", tp=t) == 2 * sbh
    assert layer_activation_bytes(model, s, b, "full", tp=t, sequence_parallel=True) == 2 * sbh / t
    assert layer_activation_bytes(model, s, b, "selective") == 34 * sbh  # positional recompute, as before


def test_layer_activation_bytes_refuses_bad_input():
    with pytest.raises(ValueError, match="recompute"):
        layer_activation_bytes(LLAMA_3_8B, 2048, 1, "some")
    with pytest.raises(ValueError, match="sequence_parallel"):
        layer_activation_bytes(LLAMA_3_8B, 2048, 1, "none", 2, "yes")


# -- the memory of one training GPU ------------------------------------------------------------------------
def test_stage_params_add_up_to_the_model():
    lay = Layout(tp=1, pp=4)
    assert sum(stage_params(LLAMA_3_8B, lay, s) for s in range(4)) == LLAMA_3_8B.n_params  # vocab 128,256 = 1002 x 128


def test_training_memory_by_hand():
    lay = Layout(tp=8, pp=16, dp=128, dp_strategy="zero1")
    m = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=0)
    d, per = 128, 6 + 12 / 128  # Megatron's distributed optimizer
    assert m.states_bytes == pytest.approx(m.params * per)
    assert m.params_bytes == pytest.approx(2 * m.params) and m.grads_bytes == pytest.approx(4 * m.params)
    assert m.optimizer_bytes == pytest.approx(12 * m.params / d)
    assert m.layers == 8 and m.in_flight == 16  # 126 layers over 16 stages: the first 14 get 8; 1F1B keeps p
    sbh = 8192 * 16384
    assert m.activations_bytes == pytest.approx(8 * 16 * 34 * sbh / 8)
    last = training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16, stage=15)
    assert last.layers == 7 and last.in_flight == 1
    assert last.ends_bytes == pytest.approx(4 * sbh / 8 * (1 + 129024 / 16384))  # v padded to 126 x 1024
    assert peak_training_memory(LLAMA_3_1_405B, lay, 8192, 1, 16).stage == 0


def test_cp_shards_the_optimizer_and_the_tokens():
    plain = training_memory(LLAMA_3_8B, Layout(1, 1, dp=8, dp_strategy="zero1"), 8192, 1, 1)
    ring = training_memory(LLAMA_3_8B, Layout(1, 1, dp=2, cp=4, dp_strategy="zero1"), 8192, 1, 1)
    assert ring.optimizer_bytes == pytest.approx(plain.optimizer_bytes)  # sharded over dp x cp = 8 both
    assert ring.activations_bytes == pytest.approx(plain.activations_bytes / 4)
    with pytest.raises(ValueError, match="ring slices"):
        training_memory(LLAMA_3_8B, Layout(1, 1, cp=3), 8192, 1, 1)
    with pytest.raises(ValueError, match="stage 4"):
        training_memory(LLAMA_3_8B, Layout(1, 4), 8192, 1, 4, stage=4)


def test_in_flight_microbatches():
    assert [in_flight(s, 4, 8) for s in range(4)] == [4, 3, 2, 1]
    assert in_flight(0, 4, 2) == 2  # never more than there are
    assert in_flight(0, 4, 8, "interleaved", chunks=2) == pytest.approx(4 * (1 + 3 / 8))


# -- published figures ------------------------------------------------------------------------------------
def test_zero_figure_1_reproduced():
    rows = zero_figure_rows()
    assert [r.published for r in rows] == list(ZERO_FIGURE_1_GB.values()) == [120.0, 31.4, 16.6, 1.9]
    assert all(r.agrees for r in rows), [(r.what, r.ours) for r in rows]


def test_megatron_bytes_per_parameter():
    plain, dist, zero = megatron_rows(dp=64)
    assert plain.ours == 18 and dist.ours == pytest.approx(6 + 12 / 64) and zero.ours == 16
    assert STATE_BYTES_MEGATRON == {"params": 2, "grads": 4, "optimizer": 12}


def test_deepspeed_zero3_estimate_arithmetic():
    p, big = 7.5e9, 4 * 4096 ** 2
    no = deepspeed_zero3_estimate(p, big, 8, 8, cpu_offload=False)
    assert no["gpu_bytes"] == 4 * big + int(18 * p / 64)
    assert no["cpu_bytes"] == int(big * 4 * 8 * 1.5)
    both = deepspeed_zero3_estimate(p, big, 8, 8)
    assert both == {"gpu_bytes": 4 * big, "cpu_bytes": int(p * 18 / 8 * 1.5)}
    opt = deepspeed_zero3_estimate(p, big, 8, 8, cpu_offload_params=False, zero_init=False)
    assert opt == {"gpu_bytes": 4 * big + int(2 * p / 64), "cpu_bytes": int(p * max(32, 16 / 8) * 1.5)}


def test_korthikanti_table_2_for_530b():
    rows = {r.what.split(", ", 1)[1]: r for r in activation_rows()}
    assert all(r.ours == pytest.approx(r.published) for r in rows.values())
    sbh = 2048 * 20480 / 1e6
    assert rows["tensor + sequence parallel + selective recompute"].ours == pytest.approx(34 * sbh / 8)
    assert rows["no parallelism"].ours == pytest.approx(sbh * (34 + 5 * 128 * 2048 / 20480))
