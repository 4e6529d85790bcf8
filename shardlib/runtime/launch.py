"""Run a rank function under ``torchrun``: the same code a notebook runs on ``Ranks``.

    torchrun --standalone --nproc-per-node 2 -m shardlib.runtime.launch MODULE:FUNCTION [ARGS...]

``module:function`` names any importable rank function ``fn(ctx, *args)``; extra words are passed as
arguments (numbers converted). Each rank prints ``[rank R] result``, then its comm log. Ranks are placed
as in a notebook (``runtime.devices``). The exit status is non-zero when the function raised, or returned
a dict whose ``max_error`` exceeds ``core.checks.TOLERANCE`` (or is not a number).

``start_local_nodes`` starts several ``torchrun`` agents on this machine, each standing in for a node (a
c10d rendezvous on loopback), and collects what each printed: how the tests try the two-node command.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import math
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, is_dataclass

import torch.distributed as dist

from shardlib.core.checks import TOLERANCE
from shardlib.runtime.context import RankContext
from shardlib.runtime.devices import BACKENDS
from shardlib.runtime.launcher import child_env
from shardlib.runtime.records import format_log


def _value(text: str):
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def failed_check(result) -> str:
    """Why ``result`` fails (``""`` if it does not): a ``max_error`` above ``TOLERANCE``, or not a number."""
    if not isinstance(result, dict) or "max_error" not in result:
        return ""
    error = result["max_error"]
    is_number = isinstance(error, (int, float)) and not isinstance(error, bool)
    if is_number and math.isfinite(error) and error <= TOLERANCE:
        return ""
    return f"max_error {error!r} exceeds {TOLERANCE:g}: the result differs from its reference"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shardlib.runtime.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="module:function, e.g. shardlib.lab.intro.ranks:first_all_reduce_on_rank")
    parser.add_argument("args", nargs="*", help="arguments passed to the function after ctx")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    opts = parser.parse_args(argv)
    module_name, _, fn_name = opts.target.partition(":")
    if not fn_name:
        parser.error(f"target must look like module:function, got {opts.target!r}")
    fn = getattr(importlib.import_module(module_name), fn_name)
    ctx = RankContext.from_env(opts.backend)
    try:
        if dist.is_initialized():  # every rank connected before any raises: none sees a broken mesh
            dist.barrier()
        try:
            result = fn(ctx, *[_value(a) for a in opts.args])
            if is_dataclass(result):  # printed as a dict: a line Python reads back (``AgentRun.results``)
                result = asdict(result)
        except Exception as exc:  # the error in a line, then the traceback torchrun shows
            print(f"[rank {ctx.rank}] {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            raise
        _say(f"[rank {ctx.rank}] {result}")  # one write per line: ranks share the agent's stdout
        for line in format_log(ctx.comm.records).splitlines():
            _say(f"[rank {ctx.rank}] {line}")
    finally:
        dist.destroy_process_group()
    why = failed_check(result)
    if why:
        print(f"[rank {ctx.rank}] {why}", file=sys.stderr, flush=True)
        return 1
    return 0


def _say(line: str) -> None:
    """A whole line in one write (a pipe keeps writes under 4 KiB whole), so two ranks' lines never mix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- several torchrun agents on this machine, standing in for nodes -------------------------------------
@dataclass(frozen=True)
class AgentRun:
    """One torchrun agent's exit code and what its processes printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def results(self) -> list:
        """The result each of its ranks printed (``[rank R] {...}`` lines), read back as Python values."""
        out = []
        for line in re.split(r"\n|(?=\[rank \d+\] )", self.stdout):  # a line cut by another rank's still parses
            head, _, rest = line.partition("] ")
            if head.startswith("[rank ") and rest and rest[0] in "{[(":
                out.append(ast.literal_eval(rest))
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_local_nodes(target: str, procs_per_node: list[int], *args: str, backend: str = "auto",
                      devices_per_node: list[str] | None = None,
                      timeout_s: float = 120.0) -> tuple[list[AgentRun], str]:
    """Start one ``torchrun`` agent per entry of ``procs_per_node`` (its ``--nproc-per-node``), all meeting
    at one c10d rendezvous on loopback, each running ``python -m shardlib.runtime.launch target *args``; wait for
    every agent (killing all that are left at ``timeout_s``, workers included) and return their runs and
    the job's rendezvous id (each worker has it as ``TORCHELASTIC_RUN_ID``). ``devices_per_node`` gives
    each agent its ``CUDA_VISIBLE_DEVICES`` (two agents on one machine would otherwise see the same GPUs)."""
    run_id = f"shardlib-{uuid.uuid4().hex[:12]}"
    endpoint = f"127.0.0.1:{_free_port()}"
    agents = []
    for i, n in enumerate(procs_per_node):
        env = child_env(threads=1)
        if devices_per_node is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices_per_node[i]
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(len(procs_per_node)),
               "--nproc-per-node", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", run_id,
               "--local-addr", "127.0.0.1", "--max-restarts", "0",
               "-m", "shardlib.runtime.launch", "--backend", backend, target, *args]
        agents.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    deadline = time.monotonic() + timeout_s
    runs = []
    try:
        for agent in agents:
            try:
                out, err = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(agent)
                out, err = agent.communicate()
                err += f"\n(stopped after {timeout_s:g} s)"
            runs.append(AgentRun(agent.returncode, out, err))
    finally:
        for agent in agents:
            _stop(agent)
        for pid in processes_of_job(run_id):  # a worker its agent did not take down
            os.kill(pid, 9)
    return runs, run_id


def _stop(agent: subprocess.Popen) -> None:
    """SIGTERM first (torchrun then stops its workers, each in a session of its own), SIGKILL if it lingers."""
    if agent.poll() is None:
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()


def processes_of_job(run_id: str) -> list[int]:
    """Live processes of the torchrun job ``run_id`` (torchrun gives each worker ``TORCHELASTIC_RUN_ID``),
    read from /proc (an empty list where there is none)."""
    mark = f"TORCHELASTIC_RUN_ID={run_id}".encode()
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has already exited
                    found.append(int(entry))
        except OSError:
            continue
    return found


if __name__ == "__main__":
    sys.exit(main())
