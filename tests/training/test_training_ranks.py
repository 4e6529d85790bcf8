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

import pytest

from shardlib import Ranks
from shardlib.launch import start_local_nodes
from shardlib.mesh import Layout
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
    "pp2-cp2": Layout(tp=1, pp=2, cp=2),
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
    check_exact(run_training(pool4, FOUR[name], CONFIG), FOUR[name])


def test_uneven_stages_train_exactly(pool4):
    layout = Layout(tp=1, pp=2, dp=2)
    run = run_training(pool4, layout, CONFIG, stage_counts=(3, 1))
    assert [len(r) for r in run.stage_layers] == [3, 1]
    check_exact(run, layout)


def test_eight_ranks_dp2_pp2_tp2_train_exactly(pool8):
    layout = Layout(tp=2, pp=2, dp=2)
    check_exact(run_training(pool8, layout, CONFIG), layout)


def test_float32_ledger_and_traffic_equal_the_prediction_on_four_stages(pool4):
    config = TrainingConfig(m=3, dtype="float32")  # fewer microbatches than stages: 1F1B still runs
    run = run_training(pool4, Layout(tp=1, pp=4), config)
    assert run.predicted_ledgers() == run.ledgers, run.ledger_text()
    acts = [ledger["activations"] for ledger in run.ledgers]
    assert acts[0] > acts[1] > acts[2]  # 1F1B: stage s keeps p - s microbatches in flight
    for r in range(4):
        assert run.predicted_traffic(r) == run.traffic_by_axis(r)


def test_a_layout_that_does_not_fill_the_pool_is_refused_before_any_rank_starts(pool4):
    with pytest.raises(ValueError, match="must multiply"):
        run_training(pool4, Layout(tp=2, pp=1), CONFIG)


@pytest.mark.parametrize("across", ["pp"])  # "dp" passes too (11 s more); pp is the one 1F1B crosses
def test_training_across_two_torchrun_agents(across):
    agents, run_id = start_local_nodes("shardlib.training.machines:training_across_on_rank", [2, 2], across,
                                       backend="gloo", timeout_s=180)
    for agent in agents:
        assert agent.returncode == 0, agent.stdout + agent.stderr
    results = agents[0].results + agents[1].results
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    for r in results:
        assert r["tp_group"] == [2 * r["node"], 2 * r["node"] + 1]  # tp inside one agent's processes
        assert r["max_error"] < TOLERANCE and r["traffic_matches_prediction"]


class _NoCollectives:
    rank, world_size = 0, 3

    def __getattr__(self, name):
        raise AssertionError(f"{name} used before the input was checked")


@pytest.mark.parametrize("kwargs, words", [
    ({"nodes": 2, "per_node": 2}, "world size 3 is not nodes x processes per node = 2 x 2"),
    ({"nodes": 1, "per_node": 3}, "KV heads"),
    ({"nodes": 3, "per_node": 1, "across": "ep"}, "across"),
])
def test_training_across_refuses_bad_input_before_any_collective(kwargs, words):
    from shardlib.training.machines import training_across_on_rank

    with pytest.raises(ValueError, match=words):
        training_across_on_rank(_NoCollectives(), **kwargs)


# -- the notebook's explorer and figures, on the same pool --------------------------------------------------
def test_the_training_explorer_runs_every_layout_it_offers_and_clamps_the_rest(pool4):
    from shardlib.ui.training_widgets import four_rank_layouts, training_explorer

    config = TrainingConfig(dtype="float64", steps=2)
    options = four_rank_layouts(4, config)
    assert (4, 1, 1, 1) not in [v for _, v in options]  # 2 KV heads cannot be split 4 ways: not offered
    slider, strategy, m, feedback, note, figure = training_explorer(pool4, config).children
    for _, value in options:
        slider.value = value
        assert feedback.value == "" and "equal to the prediction on every rank" in note.value
        assert "within" in note.value
    slider.value = (2, 2, 1, 1)  # a pipeline: ZeRO-3 is shown as ZeRO-1, m below p is raised to p
    strategy.value = "zero3"
    m.value = 1
    assert feedback.value == "" and "showing ZeRO-1" in note.value and "m = 2" in note.value
    assert len(figure.data) == 10 and list(figure.data[0].x)[0].startswith("rank 0")


def test_the_training_figures_draw_what_they_are_given():
    from shardlib.ui.training_figures import ledger_figure, loss_figure, step_time_figure, traffic_figure

    row = {"weights": 1000, "gradients": 1000, "optimizer": 2000, "activations": 500, "transient": 0}
    fig = ledger_figure([row, row], [row, row], ["rank 0", "rank 1"], "t")
    assert [t.y[0] for t in fig.data[:5]] == [1.0, 1.0, 2.0, 0.5, 0.0]  # kB, stacked
    assert fig.data[-1].y[0] == 4.5  # the predicted top of the last term: the total
    assert len(loss_figure({"a": [3, 2]}, {"ref": [3, 2]}, floor_nats=1.0).data) == 2
    assert [t.name for t in traffic_figure({"x": {"tp": 10, "dp": 5}}, "t").data] == ["tp axis", "dp axis"]
    assert len(step_time_figure({"a": 0.1}, {"a": 0.2}, "t").data) == 4
