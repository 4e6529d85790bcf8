"""The same rank functions under torchrun, two CPU processes, gloo."""

import os
import subprocess
import sys

import pytest


def test_first_all_reduce_under_torchrun(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "shardlib.launch", "shardlib.runtime.basics:first_all_reduce_on_rank", "3"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=tmp_path, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[rank 0] {'before': [1.0, 1.0, 1.0], 'after': [3.0, 3.0, 3.0]}" in out.stdout
    assert "[rank 1] {'before': [2.0, 2.0, 2.0], 'after': [3.0, 3.0, 3.0]}" in out.stdout
    assert out.stdout.count("all_reduce") == 2  # each rank's comm log: one all-reduce


def test_from_env_outside_torchrun_says_how_to_start(monkeypatch):
    from shardlib import RankContext

    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="torchrun --nproc-per-node"):
        RankContext.from_env()


def test_launch_refuses_a_target_without_a_function(capsys):
    from shardlib.launch import main

    with pytest.raises(SystemExit):
        main(["shardlib.runtime.basics"])
    assert "module:function" in capsys.readouterr().err
