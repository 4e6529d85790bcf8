"""Data parallelism's pure parts and its one-process pieces: flat groups, the ZeRO formulas against the
paper's own numbers, activation memory against its formula, the reference and the input checks."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.config import ModelConfig
from shardlib.core.data_parallel.flat import padded, parameter_units, plan_buckets, plan_units
from shardlib.core.mesh import DP_STRATEGIES, Layout
from shardlib.facts.models import LLAMA_3_8B
from shardlib.lab.data_parallel.activations import measure_activations
from shardlib.lab.data_parallel.reference import (
    check_training_inputs,
    global_mse,
    local_rows,
    toy_batches,
    toy_model,
    train_one_process,
)
from shardlib.lab.measure import PeakMeter
from shardlib.predict.data_parallel import (
    STATE_BYTES_FP32,
    STATE_BYTES_MEGATRON,
    STATE_BYTES_MIXED,
    gathered_peak_bytes,
    layer_activation_bytes,
    layout_memory,
    layout_step_bytes,
    memory_per_rank,
    mlp_activation_bytes,
    step_wire_bytes,
    zero_table,
)
from shardlib.predict.training.memory import training_memory


# -- flat groups ------------------------------------------------------------------------------------------
def test_buckets_take_parameters_in_reverse_until_the_cap():
    # 5, 4 and 12 elements of 4 bytes; cap 40 bytes. Reversed: 12 (48 B, alone: larger than the cap),
    # then 4 (16 B) and 5 (20 B) together (36 B), padded from 9 to 12 for 4 ranks.
    buckets = plan_buckets([5, 4, 12], element_bytes=4, dp=4, bucket_bytes=40)
    assert [b.params for b in buckets] == [(2,), (1, 0)]
    assert [b.offsets for b in buckets] == [(0,), (0, 4)]
    assert [(b.numel, b.padded_numel, b.shard_numel) for b in buckets] == [(12, 12, 3), (9, 12, 3)]
    assert buckets[1].owned(2) == (6, 9)
    assert [b.params for b in plan_buckets([5, 4, 12], 4, 4, None)] == [(2, 1, 0)]


def test_padding_and_ownership_cover_every_element_once():
    for numel in (1, 5, 8, 2458):
        for dp in (1, 2, 3, 4, 8):
            group = plan_units([[0]], [numel], dp)[0]
            assert group.padded_numel == padded(numel, dp) and group.padded_numel % dp == 0
            assert 0 <= group.padded_numel - numel < dp or group.padded_numel == dp
            covered = [i for r in range(dp) for i in range(*group.owned(r))]
            assert covered == list(range(group.padded_numel))


def test_units_must_hold_every_parameter_once():
    with pytest.raises(ValueError, match="exactly once"):
        plan_units([[0], [0]], [3, 4], 2)
    with pytest.raises(ValueError, match="rank 4 is outside"):
        plan_units([[0, 1]], [3, 4], 4)[0].owned(4)


# -- the ZeRO formulas --------------------------------------------------------------------------------------
@pytest.mark.parametrize("strategy, gb", [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9)])
def test_memory_matches_the_zero_papers_figure_1(strategy, gb):
    """ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, K = 12, 64 GPUs."""
    assert memory_per_rank(7.5e9, strategy, 64)["total"] / 1e9 == pytest.approx(gb, abs=0.05)


@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_distributed_optimizer_keeps_6_plus_12_over_d(d):
    """Megatron-LM's distributed optimizer guide, 16-bit weights with fp32 gradients: 18 bytes per parameter
    without it, ``6 + 12/d`` with it (a ZeRO-1 over ``d`` data-parallel ranks)."""
    assert memory_per_rank(1e9, "ddp", d, STATE_BYTES_MEGATRON)["total"] == pytest.approx(18e9)
    assert memory_per_rank(1e9, "zero1", d, STATE_BYTES_MEGATRON)["total"] == pytest.approx((6 + 12 / d) * 1e9)


def test_wire_bytes_all_reduce_equals_reduce_scatter_plus_all_gather():
    n, dp = 1_000_000, 8
    ddp = step_wire_bytes(n, "ddp", dp)
    assert ddp == pytest.approx(2 * 7 / 8 * n * 2)
    assert step_wire_bytes(n, "zero1", dp) == step_wire_bytes(n, "zero2", dp) == ddp
    assert step_wire_bytes(n, "zero3", dp) == pytest.approx(1.5 * ddp)


def test_zero_table_for_llama_3_8b_on_8_gpus():
    rows = {r["strategy"]: r for r in zero_table([LLAMA_3_8B], dp=8)}
    p = LLAMA_3_8B.n_params / 1e9  # 8.03
    assert rows["ddp"]["total_gb"] == pytest.approx(16 * p)  # 128 GB: more than one 80 GB GPU
    assert rows["zero3"]["total_gb"] == pytest.approx(2 * p)  # 16 GB
    assert rows["zero1"]["optimizer_gb"] == pytest.approx(12 * p / 8)
    assert rows["zero2"]["grads_gb"] == pytest.approx(2 * p / 8) and rows["zero2"]["params_gb"] == pytest.approx(2 * p)


def test_layout_predictions_count_padding_and_every_collective():
    groups = plan_buckets([5, 4, 12], element_bytes=4, dp=4, bucket_bytes=40)  # padded 12 + 12 = 24 elements
    assert layout_memory(groups, "zero2", 4) == {"params": 96, "grads": 24, "optimizer": 48}
    assert layout_memory(groups, "ddp", 4) == {"params": 96, "grads": 96, "optimizer": 192}
    zero1 = layout_step_bytes(groups, "zero1", 4, 4)
    assert zero1 == {"reduce_scatter": {"count": 2, "size_bytes": 96, "wire_bytes": 72},
                     "all_gather": {"count": 2, "size_bytes": 96, "wire_bytes": 72}}
    zero3 = layout_step_bytes(groups, "zero3", 4, 4)
    assert zero3["all_gather"]["count"] == 4 and zero3["reduce_scatter"]["count"] == 2
    assert gathered_peak_bytes(plan_units([[0], [1], [2]], [4, 12, 8], 4), 4, prefetch=False) == 48
    assert gathered_peak_bytes(plan_units([[0], [1], [2]], [4, 12, 8], 4), 4, prefetch=True) == 80


def test_activation_formulas():
    model = ModelConfig("gpt-ish", n_layers=2, d_model=4096, n_heads=32, n_kv_heads=32, d_ff=16384, vocab_size=64)
    sbh = 2048 * 1 * 4096
    assert layer_activation_bytes(model, 2048, 1, "none") == sbh * (34 + 5 * 32 * 2048 / 4096)  # 114 sbh
    assert layer_activation_bytes(model, 2048, 1, "selective") == 34 * sbh
    assert layer_activation_bytes(model, 2048, 1, "full") == 2 * sbh
    budget = training_memory(model, Layout(1, 2, 8, dp_strategy="zero1"), 2048, 1, 2, recompute="full",
                             state_bytes=STATE_BYTES_MIXED)
    assert budget.activations_bytes == 1 * 2 * sbh * 2  # one layer per stage, 2 microbatches in flight
    assert budget.total_bytes == pytest.approx(budget.states_bytes + budget.activations_bytes + budget.ends_bytes)


# -- the reference, the loss and the checks -----------------------------------------------------------------
def test_the_ranks_losses_add_up_to_the_global_mean():
    x, y = toy_batches(1, 8, 6, 3)[0]
    out = torch.randn(8, 3)
    parts = [global_mse(out[local_rows(8, 4, r)], y[local_rows(8, 4, r)], y.numel()) for r in range(4)]
    assert torch.allclose(sum(parts), F.mse_loss(out, y))


def test_reference_trains_with_adamw():
    model = toy_model(8, 16, 2, 3)
    batches = toy_batches(2, 8, 8, 3)
    trained = train_one_process(model, batches, 0.01)
    twin = toy_model(8, 16, 2, 3)
    optimizer = torch.optim.AdamW(twin.parameters(), lr=0.01)
    for x, y in batches:
        F.mse_loss(twin(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(trained[k], v) for k, v in twin.state_dict().items())
    assert not torch.equal(trained["0.up.weight"], model.state_dict()["0.up.weight"])  # the copy trained


def test_units_put_the_models_own_parameters_first():
    class WithScale(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Linear(3, 3)
            self.act = nn.GELU()
            self.scale = nn.Parameter(torch.ones(3))

    assert parameter_units(WithScale()) == [("", ["scale"]), ("body", ["body.weight", "body.bias"])]


@pytest.mark.parametrize("args, match", [
    (dict(strategy="zero4"), r"unknown strategy 'zero4'"),
    (dict(batches=toy_batches(1, 6, 8, 3)), r"6 rows, which do not divide among 4 ranks \(6 = 4 x 1 \+ 2\)"),
    (dict(lr=0.0), r"lr \(the learning rate\) must be a positive number, got 0.0"),
    (dict(lr=-1), r"got -1"),
    (dict(bucket_bytes=0), r"bucket_bytes"),
    (dict(batches=[]), r"non-empty list"),
])
def test_bad_inputs_name_the_value(args, match):
    kw = dict(strategy="ddp", model=toy_model(8, 16, 2, 3), batches=toy_batches(1, 8, 8, 3), lr=0.01)
    kw.update(args)
    with pytest.raises(ValueError, match=match):
        check_training_inputs(4, kw["strategy"], kw["model"], kw["batches"], kw["lr"], kw.get("bucket_bytes"))


def test_a_model_with_integer_parameters_is_refused():
    model = toy_model(8, 16, 1, 3)
    model.register_parameter("count", nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False))
    with pytest.raises(ValueError, match=r"floating point.*count \(torch.int64\)"):
        check_training_inputs(2, "ddp", model, toy_batches(1, 8, 8, 3), 0.01)


# -- activations, measured on one process -----------------------------------------------------------------
def test_activations_per_layer_match_the_formula_and_checkpointing_keeps_only_inputs():
    rows, d, h = 16, 32, 64
    model = toy_model(d, h, 3, 8)
    x, y = toy_batches(1, rows, d, 8)[0]
    plain = measure_activations(model, x, y)
    kept = measure_activations(model, x, y, checkpoint=True)
    assert plain.saved_bytes_per_unit[:3] == (mlp_activation_bytes(rows, d, h),) * 3  # rows x (d + 2h) x 4
    assert plain.saved_bytes_per_unit[3] == rows * d * 4  # the head keeps its input
    assert kept.saved_bytes_per_unit == (mlp_activation_bytes(rows, d, h, checkpoint=True),) * 4
    assert (plain.unit_forwards, kept.unit_forwards) == (4, 8)  # the recomputation: every forward twice


def test_checkpointing_leaves_the_gradients_unchanged():
    from shardlib.lab.data_parallel.activations import Checkpointed

    model = toy_model(8, 16, 2, 3)
    x, y = toy_batches(1, 8, 8, 3)[0]
    checkpointed = toy_model(8, 16, 2, 3)
    for name in ("0", "1"):
        setattr(checkpointed, name, Checkpointed(getattr(checkpointed, name)))
    for m in (model, checkpointed):
        global_mse(m(x), y, y.numel()).backward()
    assert torch.allclose(model[0].up.weight.grad, checkpointed[0].inner.up.weight.grad, atol=1e-7)
    # the recomputation runs the same operations on the same numbers: every gradient, bit for bit
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), checkpointed.parameters()))


def test_recomputation_does_not_load_torchs_compiler():
    """``torch.utils.checkpoint`` imports ``torch._dynamo`` (seconds) at its first call; ``Recompute`` does not."""
    import subprocess
    import sys

    code = ("import sys; from shardlib.lab.data_parallel.activations import measure_activations; "
            "from shardlib.lab.data_parallel.reference import toy_batches, toy_model; "
            "x, y = toy_batches(1, 8, 8, 3)[0]; "
            "m = measure_activations(toy_model(8, 16, 2, 3), x, y, checkpoint=True); "
            "print(m.unit_forwards, 'torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["6", "False"]


def test_the_meter_counts_until_a_tensor_is_freed():
    meter = PeakMeter()
    a = meter.track(torch.zeros(10))  # 40 bytes
    b = meter.track(torch.zeros(5))  # 20 bytes
    del a
    gc.collect()
    assert (meter.now_bytes, meter.peak_bytes) == (20, 60)
    meter.reserve(8)
    meter.release(8)
    assert meter.now_bytes == 20 and b.numel() == 5


def test_every_strategy_has_a_formula():
    for strategy in DP_STRATEGIES:
        mem = memory_per_rank(1000, strategy, 4, STATE_BYTES_FP32)
        assert mem["total"] == sum(mem[k] for k in ("params", "grads", "optimizer"))
    with pytest.raises(ValueError, match="unknown strategy"):
        memory_per_rank(1000, "fsdp", 4)
