"""The same rank functions under torchrun: one machine, and two torchrun agents standing in for two nodes.

Two agents on this machine meet through a c10d rendezvous on loopback, as two machines would through the
first host's address; each starts its own processes, and torchrun numbers them node by node. The layout
``tp_inside_pp_across_on_rank`` must then keep every tensor-parallel group inside one agent's processes.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from shardlib.core.mesh import Layout
from shardlib.facts.models import TOY
from shardlib.lab.machines import across_layout, tp_inside_pp_across_on_rank
from shardlib.predict.serving.traffic import forward_traffic
from shardlib.runtime.launch import processes_of_job, start_local_nodes

ROOT = Path(__file__).resolve().parents[2]
AGENT_TIMEOUT_S = 120  # a hung rendezvous or rank fails the test instead of hanging it


def _env() -> dict:
    path = os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)


def test_first_all_reduce_under_torchrun(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "shardlib.runtime.launch", "shardlib.lab.intro.ranks:first_all_reduce_on_rank", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=_env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[rank 0] {'before': [1.0, 1.0, 1.0], 'after': [3.0, 3.0, 3.0]}" in out.stdout
    assert "[rank 1] {'before': [2.0, 2.0, 2.0], 'after': [3.0, 3.0, 3.0]}" in out.stdout
    assert out.stdout.count("all_reduce") == 2  # each rank's comm log: one all-reduce


def test_from_env_outside_torchrun_says_how_to_start(monkeypatch):
    from shardlib.runtime.context import RankContext

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        RankContext.from_env()


def test_launch_refuses_a_target_without_a_function(capsys):
    from shardlib.runtime.launch import main

    with pytest.raises(SystemExit):
        main(["shardlib.lab.intro.ranks"])
    assert "module:function" in capsys.readouterr().err


# -- the exit status of a launched check ----------------------------------------------------------------
def reports_error_on_rank(ctx, max_error):
    return {"max_error": max_error}


@pytest.mark.parametrize("max_error, code", [(0.0, 0), (1e-5, 0), (2e-5, 1), (float("nan"), 1), ("0", 1)])
def test_launch_exits_non_zero_when_max_error_exceeds_its_bound(monkeypatch, capsys, max_error, code):
    import shardlib.runtime.launch

    fake = SimpleNamespace(rank=0, comm=SimpleNamespace(records=[]))
    monkeypatch.setattr(shardlib.runtime.launch.RankContext, "from_env", staticmethod(lambda backend: fake))
    monkeypatch.setattr(shardlib.runtime.launch.dist, "destroy_process_group", lambda: None)
    assert shardlib.runtime.launch.main([f"{__name__}:reports_error_on_rank", repr(max_error)]) == code
    assert ("exceeds 1e-05" in capsys.readouterr().err) == bool(code)


# -- tp inside a node, pp across nodes: the pieces, in this process and on a pool -----------------------
class NoCollectives:
    """A ctx whose every collective or group fails the test: checks must come before any of them."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size, self.device, self.backend = rank, world_size, torch.device("cpu"), "gloo"

    def __getattr__(self, name):
        raise AssertionError(f"{name} used before the input was checked")


@pytest.mark.parametrize("world, kwargs, words", [
    (3, {"nodes": 2, "per_node": 2}, r"world size 3 is not nodes x processes per node = 2 x 2 = 4"),
    (4, {"nodes": 2, "per_node": 2, "batch": 3}, r"a batch of 3 sequences cannot be cut into dp x m = 1 x 2 = 2"),
    (3, {"nodes": 1, "per_node": 3}, r"toy cannot use tp = 3: 4 KV heads cannot be split 3 ways"),
    (5, {"nodes": 5, "per_node": 1}, r"4 layers cannot fill 5 stages: each stage needs a whole layer"),
    (4, {"nodes": 2}, r"per_node is not given and LOCAL_WORLD_SIZE is not set"),
])
def test_bad_input_is_refused_before_any_collective(monkeypatch, world, kwargs, words):
    for var in ("GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(var, raising=False)
    for rank in range(world):
        with pytest.raises(ValueError, match=words):
            tp_inside_pp_across_on_rank(NoCollectives(rank, world), **kwargs)


def test_across_layout_puts_a_node_in_each_tp_group():
    layout = across_layout(8, nodes=2, per_node=4)
    assert layout == Layout(tp=4, pp=2)
    assert layout.tp_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]] and layout.pp_groups()[1] == [1, 5]


def _hand_worked_traffic() -> dict:
    """2 nodes x 2 processes, 4 sequences of 6 tokens in 2 microbatches: a microbatch is 2 x 6 x 64
    float32 = 3,072 bytes. tp: 4 ranks x (2 layers per stage x 2 all-reduces x 2 microbatches) = 32
    all-reduces of a microbatch; pp: 1 boundary x 2 tp ranks x 2 microbatches = 4 sends + 4 receives."""
    mb_bytes = 2 * 6 * TOY.d_model * 4
    return {"calls": {"tp": 32, "pp": 8}, "bytes": {"tp": 32 * mb_bytes, "pp": 8 * mb_bytes}}


def _check_layout_results(results: list[dict]) -> None:
    """What every rank of a 2 x 2 run reports, checked against each other and against the formulas."""
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3]
    node_of = {r["rank"]: r["node"] for r in results}
    hand = _hand_worked_traffic()
    predicted = forward_traffic(TOY, Layout(tp=2, pp=2), 4, 6, 2)
    assert {a.axis: 0 for a in predicted}.keys() == hand["bytes"].keys()
    for axis in hand["bytes"]:
        assert sum(a.size_bytes for a in predicted if a.axis == axis) == hand["bytes"][axis]
    for r in results:
        assert r["max_error"] <= 1e-5 and r["max_error"] == results[0]["max_error"]
        assert {node_of[m] for m in r["tp_group"]} == {r["node"]} and r["rank"] in r["tp_group"]  # inside one node
        assert sorted(m for m, n in node_of.items() if n == r["node"]) == r["tp_group"]  # ... and the whole node
        assert sorted(node_of[m] for m in r["pp_group"]) == [0, 1] and r["rank"] in r["pp_group"]  # one per node
        assert r["bytes_by_axis"] == r["predicted_bytes_by_axis"] == hand["bytes"]
        assert r["calls_by_axis"] == r["predicted_calls_by_axis"] == hand["calls"]
        assert r["traffic_matches_prediction"]
    for axis in hand["bytes"]:  # each rank's own log adds up to the job's
        assert sum(r["my_bytes_by_axis"].get(axis, 0) for r in results) == hand["bytes"][axis]


def test_tp_inside_pp_across_on_a_pool(pool4):
    _check_layout_results(pool4.run(tp_inside_pp_across_on_rank, nodes=2, per_node=2))


# -- two torchrun agents: two nodes on one machine --------------------------------------------------------
TARGET = "shardlib.lab.machines:tp_inside_pp_across_on_rank"


def _no_process_left(run_id: str) -> None:
    deadline = time.monotonic() + 10
    while processes_of_job(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_of_job(run_id) == []


def test_tp_inside_pp_across_two_torchrun_agents():
    # gloo on CPU: two agents on one machine would see the same GPUs, and NCCL refuses two ranks on one
    agents, run_id = start_local_nodes(TARGET, [2, 2], backend="gloo", timeout_s=AGENT_TIMEOUT_S)
    for agent in agents:
        assert agent.returncode == 0, agent.stdout + agent.stderr
    for agent in agents:  # each agent printed its own node's two ranks, and only those
        assert len(agent.results) == 2 and len({r["node"] for r in agent.results}) == 1
        assert sorted(r["rank"] for r in agent.results) == agent.results[0]["tp_group"]
    _check_layout_results(agents[0].results + agents[1].results)
    _no_process_left(run_id)


@pytest.mark.parametrize("procs_per_node, words", [
    ([2, 1], r"world size 3 is not nodes x processes per node = 2 x (2 = 4|1 = 2)"),
    ([3], r"toy cannot use tp = 3: 4 KV heads cannot be split 3 ways"),
], ids=["uneven-nodes", "shapes-do-not-divide"])
def test_bad_input_under_torchrun_fails_every_process_and_leaves_none(procs_per_node, words):
    agents, run_id = start_local_nodes(TARGET, procs_per_node, backend="gloo", timeout_s=AGENT_TIMEOUT_S)
    for agent in agents:
        assert agent.returncode != 0 and "ValueError" in agent.stderr, agent.stdout + agent.stderr
    assert any(re.search(words, agent.stderr) for agent in agents), [agent.stderr[-2000:] for agent in agents]
    _no_process_left(run_id)


def test_printed_results_are_read_back():
    from shardlib.runtime.launch import AgentRun

    run = AgentRun(0, "[rank 1] {'max_error': 0.0}\n[rank 1] rank  op\n[rank 0] [1, 2]\nother\n", "")
    assert run.results == [{"max_error": 0.0}, [1, 2]]
    mixed = AgentRun(0, "[rank 0] {'rank': 0}[rank 1] {'rank': 1}\n[rank 0] rank  op\n", "")  # two ranks, one line
    assert mixed.results == [{"rank": 0}, {"rank": 1}]
