"""``Ranks``: a warm pool of rank processes that run your functions on every rank.

``Ranks(2)`` starts two processes once, forked from the kernel's template (``template``, ``launcher``),
each joined to a ``torch.distributed`` group on loopback. ``ranks.run(fn, *args)`` ships ``fn`` by value
(cloudpickle: a notebook's own function works), calls ``fn(ctx, *args)`` on every rank and returns the
results in rank order: a slider move costs one dispatch, not a spawn. Where ranks compute follows the GPUs
(``devices.place_ranks``; ``backend=`` or ``SHARDLIB_BACKEND`` asks for one path). Faults are part of the
contract: a rank's exception is a ``RankError`` with its traceback, a call past ``timeout`` a
``RankTimeoutError`` (``errors``); either way the pool restarts, and ranks die with their parent.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.connection import Connection, wait

import torch
import torch.distributed as dist

from shardlib.core.checks import positive_number
from shardlib.runtime.context import gpu_count
from shardlib.runtime.devices import check_world_size, place_ranks
from shardlib.runtime.errors import PoolClosedError, RankError, RankTimeoutError, pack_call
from shardlib.runtime.launcher import first_reply, kill_ranks, log_tail, resolve_method, start_rank, sys_path
from shardlib.runtime.records import CommRecord
from shardlib.runtime.timeline import Span, now_s

START_TIMEOUT_S = 180.0  # importing torch on a busy 2-core box can take a while


class Ranks:
    """A persistent pool of ``world_size`` rank processes. See the module docstring."""

    def __init__(self, world_size: int = 2, *, backend: str = "auto", timeout: float = 60.0,
                 start: str = "auto") -> None:
        self.world_size = check_world_size(world_size)
        self.start_method = resolve_method(start)
        self.timeout = positive_number(timeout, "timeout (seconds)")
        if backend == "auto":  # a whole run (a test suite, every notebook) can be put on one path from outside
            backend = os.environ.get("SHARDLIB_BACKEND", "auto")
        self.placement = place_ranks(backend, self.world_size, gpu_count())  # ValueError before anything starts
        self.backend = self.placement.backend  # what torch.distributed runs: "gloo" or "nccl"
        self.last_comm: list[CommRecord] = []  # every rank's comm log from the last run
        self.last_spans: list[Span] = []  # every rank's timeline spans from the last run
        self.last_started_s = 0.0  # when the last run was dispatched, on the spans' clock
        self.devices: list[str] = []
        self._lock = threading.RLock()
        self._procs: list = []  # launcher.ForkedRank or subprocess.Popen handles
        self._conns: list[Connection] = []
        self._generation = 0
        self._ready = False
        self._closed = False
        self._logdir = tempfile.TemporaryDirectory(prefix="shardlib-ranks-")
        # The store's own socket binds every interface; hand it one bound to loopback instead.
        self._store_socket = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._store = dist.TCPStore("127.0.0.1", self._store_socket.getsockname()[1], is_master=True,
                                    wait_for_workers=False, timeout=timedelta(seconds=START_TIMEOUT_S),
                                    master_listen_fd=self._store_socket.fileno())
        self._finalizer = weakref.finalize(self, kill_ranks, self._procs)
        try:
            self._start()
            self._await_ready()
        except BaseException:
            self.close()
            raise

    # -- lifecycle -------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start the processes (forked from the template, or spawned); they join the group while we return."""
        self._generation += 1
        threads = self.threads_per_rank
        for rank in range(self.world_size):
            handle, conn = start_rank(self.start_method, threads, self._log_path(rank), START_TIMEOUT_S)
            conn.send_bytes(pickle.dumps({
                "rank": rank, "world_size": self.world_size, "backend": self.backend, "threads": threads,
                "device": self.placement.devices[rank],
                "store_host": "127.0.0.1", "store_port": self._store.port,
                "store_prefix": f"shardlib/{self._generation}", "parent_pid": handle.parent_pid,
                "start_timeout_s": START_TIMEOUT_S, "op_timeout_s": self.timeout + 60.0,
                "sys_path": sys_path(),
            }))
            self._procs.append(handle)
            self._conns.append(conn)
        self._ready = False

    def _await_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        self.devices = [""] * self.world_size
        pending = set(range(self.world_size))
        while pending:
            ready = wait([self._conns[r] for r in pending], timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._stop()
                raise RankTimeoutError(
                    f"ranks {sorted(pending)} did not start within {START_TIMEOUT_S:.0f} s",
                    min(pending), sorted(pending),
                )
            for conn in ready:
                rank = self._conns.index(conn)
                status, info = first_reply(conn, self._log_path(rank))
                if status != "ready":
                    self._stop()
                    raise RankError(f"rank {rank} failed to start:\n{info}", rank, info)
                self.devices[rank] = info["device"]
                pending.discard(rank)
        self._ready = True

    def _stop(self) -> None:
        """Kill the current processes (they may be stuck in a collective) and forget them."""
        for conn in self._conns:
            conn.close()
        kill_ranks(self._procs)
        self._procs.clear()
        self._conns.clear()
        self._ready = False

    def _restart(self) -> None:
        self._stop()
        if not self._closed:
            self._start()  # the next run waits for these to be ready

    def _log_path(self, rank: int) -> str:
        return os.path.join(self._logdir.name, f"rank{rank}.log")

    def _died(self, rank: int, when: str = "") -> tuple:
        """The reply of a rank process that has died: its exit code (``None`` if it did not exit within
        5 s) and the end of its log."""
        try:
            code = self._procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return "err", f"rank {rank} died (exit code {code}){when}", log_tail(self._log_path(rank)), ""

    def close(self) -> None:
        """Stop every rank process. Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for conn in self._conns:
                try:
                    conn.send_bytes(b"close")
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            for p in self._procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            self._stop()
            self._logdir.cleanup()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"devices={self.devices}"
        return f"Ranks(world_size={self.world_size}, backend={self.backend!r}, {state}: {self.description})"

    @property
    def threads_per_rank(self) -> int:
        """The CPU threads each rank computes with: this machine's cores shared out among the ranks."""
        return max(1, (os.cpu_count() or 1) // self.world_size)

    @contextmanager
    def same_threads(self):
        """Compute in this process with the threads a rank has, for a reference the ranks must equal bit
        for bit: a float32 matmul split over more threads may add its partial sums in another order."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads_per_rank)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    @property
    def description(self) -> str:
        """Where these ranks compute and how their collectives travel, in words, e.g. "compute on
        cuda:0, shared by 4 ranks, collectives through host memory (gloo)": every figure of live
        measurements says this, so no number passes for a link it did not cross."""
        return self.placement.label

    @property
    def pids(self) -> list[int]:
        """Process ids of the current rank processes."""
        return [p.pid for p in self._procs]

    @property
    def parent_pids(self) -> list[int]:
        """The parent of each rank process: the template it was forked from, or this process."""
        return [p.parent_pid for p in self._procs]

    # -- calls -----------------------------------------------------------------------------------
    def run(self, fn, *args, **kwargs) -> list:
        """Call ``fn(ctx, *args, **kwargs)`` on every rank; return the results in rank order.

        Text a rank prints comes back prefixed with its rank. The comm log and timeline spans of the
        call are kept in ``last_comm`` and ``last_spans``.
        """
        if not callable(fn):
            raise TypeError(f"run() needs a function to call on every rank, like run(my_fn); got {fn!r}")
        payload = pack_call(fn, args, kwargs)
        with self._lock:
            if self._closed:
                raise PoolClosedError("this Ranks pool is closed; start a new one with Ranks(...)")
            if not self._ready:
                self._await_ready()
            try:
                return self._dispatch(payload)
            except KeyboardInterrupt:
                self._restart()  # the ranks may be mid-collective: start clean
                raise

    def _dispatch(self, payload: bytes) -> list:
        self.last_started_s = now_s()
        replies: dict[int, tuple] = {}
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError:  # the rank died between calls (killed, out of memory)
                replies[rank] = self._died(rank, " before the call; the ranks were restarted, run the call again")
        deadline = time.monotonic() + self.timeout
        while len(replies) < self.world_size:
            pending = [self._conns[r] for r in range(self.world_size) if r not in replies]
            # once one rank failed, the others are likely blocked on it: collect briefly, then stop
            failed = any(reply[0] == "err" for reply in replies.values())
            ready = wait(pending, timeout=0.05 if failed else max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for conn in ready:
                rank = self._conns.index(conn)
                try:
                    replies[rank] = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    replies[rank] = self._died(rank)
        errors = {rank: reply for rank, reply in replies.items() if reply[0] == "err"}
        for rank in sorted(replies):  # what each rank printed, labelled
            for line in replies[rank][-1].splitlines():
                print(f"[rank {rank}] {line}")
        if errors:
            self._restart()
            first = min(errors)
            _, summary, tb, _ = errors[first]
            others = sorted(set(errors) - {first})
            also = f" (ranks {others} failed too)" if others else ""
            raise RankError(f"{summary}{also}\n\nTraceback on rank {first}:\n{tb}", first, tb)
        if len(replies) < self.world_size:
            silent = [r for r in range(self.world_size) if r not in replies]
            self._restart()
            raise RankTimeoutError(
                f"the call did not finish within timeout={self.timeout:g} s: ranks {silent} never answered "
                f"(a rank waiting in a collective that another rank skipped looks like this); "
                f"the ranks were restarted", silent[0], silent,
            )
        self.last_comm = [rec for r in range(self.world_size) for rec in replies[r][2]]
        self.last_spans = [s for r in range(self.world_size) for s in replies[r][3]]
        return [replies[r][1] for r in range(self.world_size)]

