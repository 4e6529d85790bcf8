"""The training step on real ranks, exact against the one-process reference at every tested layout.

Every run's ledger (bytes kept, activations in flight, transient peak) and traffic per axis also equal
``predict.training.ledger``, rank by rank, to the byte. Tolerance: ``TOLERANCE`` (1e-5) on every step's loss
and every final weight, the runs in float64. A cross-rank sum (tp's all-reduces and reduce-scatters,
the dp x cp gradient sum, the ring's online softmax) adds the same numbers in another order than one
process; AdamW then divides each update by ``sqrt(v)``, so a rounding difference in a small gradient
becomes a larger one in the weight, and it grows step by step. In float32, 10 steps left gaps of 2e-6
(dp2 x tp2) to 8e-6 (cp2 x tp2): at the edge of ``TOLERANCE``. In float64 the gaps are ~1e-14, so
``TOLERANCE`` holds with room to spare while a real mistake (a missing sum, a wrong shard: 1e-2 and up)
cannot hide under it.
"""

from dataclasses import replace

import pytest

from shardlib.core.checks import TOLERANCE
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.training.config import TrainingConfig
from shardlib.core.training.reference import train_reference
from shardlib.lab.training.drivers import run_training
from shardlib.runtime.launch import start_local_nodes
from shardlib.runtime.ranks import Ranks

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


def reference(dp, config=CONFIG):
    key = (replace(config, schedule="1f1b", chunks=1), dp)  # one process knows no schedule
    if key not in _REFERENCES:
        _REFERENCES[key] = train_reference(key[0], dp)
    return _REFERENCES[key]


@pytest.fixture(scope="module")
def pool8():
    with Ranks(8) as ranks:
        yield ranks


def check_exact(run, layout):
    gap = run.against_reference(reference(layout.dp, run.config))
    assert gap < TOLERANCE, f"{layout.label}: largest gap {gap:.2e}"
    assert run.losses[-1] < run.losses[0]
    assert run.predicted_ledgers() == run.ledgers  # every rank, every term, to the byte
    assert run.traffic_mismatches() == []  # every axis of every rank: calls, buffer and wire bytes


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
    assert run.predicted_ledgers() == run.ledgers
    acts = [ledger["activations"] for ledger in run.ledgers]
    assert acts[0] > acts[1] > acts[2]  # 1F1B: stage s keeps p - s microbatches in flight
    assert run.traffic_mismatches() == []


SCHEDULED = {  # the same model under other schedules of the registry: the same losses and weights
    "interleaved-pp2-tp2": (Layout(tp=2, pp=2), replace(CONFIG, schedule="interleaved-1f1b", chunks=2)),
    "interleaved-pp2-dp2-zero2": (Layout(tp=1, pp=2, dp=2, dp_strategy="zero2"),
                                  replace(CONFIG, schedule="interleaved-1f1b", chunks=2, m=4)),
    "zb-h1-pp2-tp2": (Layout(tp=2, pp=2), replace(CONFIG, schedule="zb-h1")),
    "zb-h1-pp2-dp2": (Layout(tp=1, pp=2, dp=2), replace(CONFIG, schedule="zb-h1")),
    "zb-h1-pp2-cp2-zero1": (Layout(tp=1, pp=2, cp=2, dp_strategy="zero1"), replace(CONFIG, schedule="zb-h1", m=3)),
    "zb-v-pp2-tp2": (Layout(tp=2, pp=2), replace(CONFIG, schedule="zb-v")),  # stage 0: embedding and head
    "dualpipev-pp2-dp2": (Layout(tp=1, pp=2, dp=2), replace(CONFIG, schedule="dualpipev", m=4)),
}


@pytest.mark.parametrize("name", list(SCHEDULED))
def test_other_schedules_train_exactly(pool4, name):
    layout, config = SCHEDULED[name]
    run = run_training(pool4, layout, config)
    assert len(run.stage_layers) == layout.pp * make_schedule(config.schedule, layout.pp, config.m,
                                                              n_chunks=config.chunks).n_chunks
    check_exact(run, layout)  # the same numbers as one process, whatever the order


def test_interleaving_splits_each_stage_into_chunks_that_hold_fewer_microbatches_in_flight(pool4):
    layout = Layout(tp=1, pp=2, dp=2)
    plain = run_training(pool4, layout, replace(CONFIG, m=4, steps=1))
    chunked = run_training(pool4, layout, replace(CONFIG, m=4, steps=1, schedule="interleaved-1f1b", chunks=2))
    assert [list(r) for r in chunked.stage_layers] == [[0], [1], [2], [3]]  # stage 0 holds layers 0 and 2
    assert chunked.predicted_ledgers() == chunked.ledgers
    pp_sends = [chunked.traffic_by_axis(r)[("pp", "send")][0] for r in range(4)]
    assert pp_sends == [2 * 4 + 4, 2 * 4 + 4] * 2  # every microbatch crosses 3 boundaries each way
    assert plain.traffic_by_axis(0)[("pp", "send")][0] == 4  # stage 0's activations, once per microbatch


@pytest.mark.parametrize("layout, config, words", [
    (Layout(tp=2, pp=2), replace(CONFIG, schedule="interleaved-1f1b", chunks=2, m=3), "multiple of 2"),
    (Layout(tp=2, pp=2), replace(CONFIG, schedule="interleaved-1f1b"), "at least 2 model chunks"),
    (Layout(tp=2, pp=2), replace(CONFIG, schedule="dualpipev"), "at least 2 n_stages = 4 microbatches"),
    (Layout(tp=1, pp=4), replace(CONFIG, schedule="interleaved-1f1b", chunks=2, m=4), "4 layers cannot fill"),
    (Layout(tp=2, pp=2, dp=1, dp_strategy="zero3"), CONFIG, "pp = 1 only"),
    (Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"), replace(CONFIG, schedule="zb-h1"), "split backward"),
])
def test_check_training_refuses_a_schedule_that_cannot_run_before_any_rank_starts(layout, config, words):
    with pytest.raises(ValueError, match=words):
        run_training(_NoRanks(layout.world_size), layout, config)


def test_a_training_config_names_a_schedule_of_the_registry():
    with pytest.raises(ValueError, match="unknown schedule"):
        TrainingConfig(schedule="2f2b")
    with pytest.raises(ValueError, match="chunks"):
        TrainingConfig(chunks=0)


class _NoRanks:
    """Stands in for a pool; fails the test if anything starts on it."""

    def __init__(self, world_size):
        self.world_size = world_size

    def run(self, *args, **kwargs):
        raise AssertionError("a rank started")


def test_a_layout_that_does_not_fill_the_pool_is_refused_before_any_rank_starts(pool4):
    with pytest.raises(ValueError, match="must multiply"):
        run_training(pool4, Layout(tp=2, pp=1), CONFIG)


@pytest.mark.parametrize("across", ["pp"])  # "dp" passes too (11 s more); pp is the one 1F1B crosses
def test_training_across_two_torchrun_agents(across):
    agents, run_id = start_local_nodes("shardlib.lab.machines:training_across_on_rank", [2, 2], across,
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
    from shardlib.lab.machines import training_across_on_rank

    with pytest.raises(ValueError, match=words):
        training_across_on_rank(_NoCollectives(), **kwargs)


# -- the notebook's explorer and figures, on the same pool --------------------------------------------------
def test_the_training_explorer_runs_every_layout_it_offers_and_clamps_the_rest(pool4):
    from shardlib.ui.training_widgets import four_rank_layouts, training_explorer

    config = TrainingConfig(dtype="float64", steps=2)
    options = four_rank_layouts(4, config)
    assert (4, 1, 1, 1) not in [v for _, v in options]  # 2 KV heads cannot be split 4 ways: not offered
    slider, strategy, mlp, m, feedback, note, figure = training_explorer(pool4, config).children
    for _, value in options:
        slider.value = value
        assert feedback.value == "" and "equal to the prediction on every rank" in note.value
        assert "within" in note.value
    slider.value = (2, 2, 1, 1)  # a pipeline: m below p is raised to p; ZeRO-3 is refused, in the learner's terms
    m.value = 1
    assert feedback.value == "" and "m = 2" in note.value
    assert len(figure.figure.data) == 10 and list(figure.figure.data[0].x)[0].startswith("rank 0")
    strategy.value = "zero3"
    assert "ZeRO-3 runs here with pp = 1 only" in feedback.value and note.value == ""
    strategy.value = "zero1"
    dense = [tuple(t.y) for t in figure.figure.data[:3]]
    mlp.value = 4  # 4 experts over ep 4: a stage of tp x dp = 2 ranks cannot spread them
    assert "ep = 4 must divide the tp x dp x cp" in feedback.value
    mlp.value = 2
    assert feedback.value == "" and "4 experts" in figure.figure.layout.title.text
    assert "equal to the prediction on every rank" in note.value and "within" in note.value
    assert [tuple(t.y) for t in figure.figure.data[:3]] != dense  # the experts' weights, gradients and moments
    slider.value, strategy.value, mlp.value = (2, 1, 2, 1), "ddp", 4  # dp 2 x tp 2: ep 4, one expert per rank
    assert feedback.value == "" and "ep=4" in figure.figure.layout.title.text
    slider.value = (2, 1, 1, 2)  # cp 2 x tp 2: the experts do not run with the ring
    assert "experts with a context-parallel ring" in feedback.value
    slider.value, mlp.value = (2, 1, 2, 1), 1  # every expert on every rank: no all-to-all, still exact
    assert feedback.value == "" and "within" in note.value and "equal to the prediction" in note.value


def test_the_training_figures_draw_what_they_are_given():
    from shardlib.ui.training_figures import ledger_figure, loss_figure, step_time_figure, traffic_figure

    row = {"weights": 1000, "gradients": 1000, "optimizer": 2000, "activations": 500, "transient": 0}
    fig = ledger_figure([row, row], [row, row], ["rank 0", "rank 1"], "t")
    assert [t.y[0] for t in fig.data[:5]] == [1.0, 1.0, 2.0, 0.5, 0.0]  # kB, stacked
    assert fig.data[-1].y[0] == 4.5  # the predicted top of the last term: the total
    assert len(loss_figure({"a": [3, 2]}, {"ref": [3, 2]}, floor_nats=1.0).data) == 2
    assert [t.name for t in traffic_figure({"x": {"tp": 10, "dp": 5}}, "t").data] == ["tp axis", "dp axis"]
    assert len(step_time_figure({"a": 0.1}, {"a": 0.2}, "t").data) == 4


def test_the_moe_layout_explorer_scores_what_its_controls_pick():
    from shardlib.ui.training_widgets import moe_layout_explorer

    box = moe_layout_explorer()
    (pp, ep), overlap, feedback, note, figure = box.children[0].children, *box.children[1:]
    assert "your layout (tp=1 pp=16 dp=128 ep=64 zero1): 1.75 M tokens/s" in note.value  # the published layout
    def all_to_alls():  # your layout's bar of the all-to-alls term
        return next(t for t in figure.figure.data if t.name == "expert all-to-alls").y[0]
    exposed = all_to_alls()
    overlap.value = True  # DualPipe's overlap: the all-to-alls under compute
    assert exposed > 0 == all_to_alls() and feedback.value == ""
    pp.value, ep.value = 32, 256  # dp = 64: ep 256 cannot divide it
    assert "showing ep = 64" in note.value and "pp=32" in note.value
    pp.value, ep.value = 4, 1  # every expert on every GPU of 4 stages: does not fit
    assert "does not fit" in note.value and figure.figure.data[0].y[0] == 0 and feedback.value == ""
