"""The training step on real ranks, exact against the one-process reference at every tested layout.

Every run's ledger (bytes kept, activations in flight, transient peak) and traffic per axis also equal
``training.predict``, rank by rank, to the byte. Tolerance: ``TOLERANCE`` (1e-5) on every step's loss
and every final weight, the runs in float64. A cross-rank sum (tp's all-reduces and reduce-scatters,
the dp x cp gradient sum, the ring's online softmax) adds the same numbers in another order than one
process; AdamW then divides each update by ``sqrt(v)``, so a rounding difference in a small gradient
becomes a larger one in the weight, and it grows step by step. In float32, 10 steps left gaps of 2e-6
(dp2 x tp2) to 8e-6 (cp2 x tp2): at the edge of ``TOLERANCE``. In float64 the gaps are ~1e-14, so
``TOLERANCE`` holds with room to spare while a real mistake (a missing sum, a wrong shard: 1e-2 and up)
cannot hide under it.
"""

import time

import pytest

from shardlib import Ranks
from shardlib.plan.layout import Layout
from shardlib.runtime.measure import TOLERANCE
from shardlib.training.corpus import TrainingConfig
from shardlib.training.drivers import run_training
from shardlib.training.reference import train_reference

CONFIG = TrainingConfig(dtype="float64")
FOUR = {
    "dp2-tp2": Layout(tp=2, pp=1, dp=2),
    "pp2-tp2": Layout(tp=2, pp=2),
    "dp2-pp2": Layout(tp=1, pp=2, dp=2),
    "cp2-tp2": Layout(tp=2, pp=1, cp=2),
    "dp2-tp2-zero3": Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"),
    "dp2-tp2-zero1": Layout(tp=2, pp=1, dp=2, dp_strategy="zero1"),
    "dp2-tp2-zero2": Layout(tp=2, pp=1, dp=2, dp_strategy="zero2"),
    "dp2-cp2": Layout(tp=1, pp=1, dp=2, cp=2),
}
_REFERENCES: dict = {}


def reference(dp):
    if dp not in _REFERENCES:
        _REFERENCES[dp] = train_reference(CONFIG, dp)
    return _REFERENCES[dp]


@pytest.fixture(scope="module")
def pool8():
    with Ranks(8) as ranks:
        yield ranks


def check_exact(run, layout):
    gap = run.against_reference(reference(layout.dp))
    assert gap < TOLERANCE, f"{layout.label}: largest gap {gap:.2e}"
    assert run.losses[-1] < run.losses[0]
    assert run.predicted_ledgers() == run.ledgers, run.ledger_text()  # every rank, every term, to the byte
    for r in range(layout.world_size):
        assert run.predicted_traffic(r) == run.traffic_by_axis(r), f"rank {r}"


@pytest.mark.parametrize("name", list(FOUR))
def test_four_rank_layouts_train_exactly(pool4, name):
    start = time.perf_counter()
    run = run_training(pool4, FOUR[name], CONFIG)
    check_exact(run, FOUR[name])
    assert time.perf_counter() - start < 30


def test_uneven_stages_train_exactly(pool4):
    layout = Layout(tp=1, pp=2, dp=2)
    run = run_training(pool4, layout, CONFIG, stage_counts=(3, 1))
    assert [len(r) for r in run.stage_layers] == [3, 1]
    check_exact(run, layout)


def test_eight_ranks_dp2_pp2_tp2_train_exactly(pool8):
    layout = Layout(tp=2, pp=2, dp=2)
    check_exact(run_training(pool8, layout, CONFIG), layout)


def test_float32_ledger_and_traffic_equal_the_prediction_on_four_stages(pool4):
    config = TrainingConfig(m=4, dtype="float32")
    run = run_training(pool4, Layout(tp=1, pp=4), config)
    assert run.predicted_ledgers() == run.ledgers, run.ledger_text()
    acts = [ledger["activations"] for ledger in run.ledgers]
    assert acts[0] > acts[1] > acts[2]  # 1F1B: stage s keeps p - s microbatches in flight
    for r in range(4):
        assert run.predicted_traffic(r) == run.traffic_by_axis(r)


def test_a_layout_that_does_not_fill_the_pool_is_refused_before_any_rank_starts(pool4):
    with pytest.raises(ValueError, match="must multiply"):
        run_training(pool4, Layout(tp=2, pp=1), CONFIG)
