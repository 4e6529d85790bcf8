"""The template process: torch imported once, rank processes forked from it on demand.

Importing torch takes a second or more per rank; the first pool of a kernel starts one template
(``python -m shardlib.runtime.template FD``) that imports torch and the worker and waits. Each rank is
``os.fork()`` ed from it, as ``multiprocessing``'s forkserver does, so a pool starts in the time it takes
to join the process group. Fork is safe because the template never starts a thread, touches CUDA or runs
a torch operation (it checks it is single-threaded before every fork). Protocol over one socket: the
kernel sends ``{"parent_pid", "sys_path"}`` once and one request per rank (its socket passed as a file
descriptor); the template answers ``ready``, ``spawned``/``refused`` and ``exited``; ``b"close"`` ends it.
The template dies with the kernel and each rank with the template (``PR_SET_PDEATHSIG`` and a parent
check every 0.2 s): a kernel killed with SIGKILL leaves nothing behind.
"""

from __future__ import annotations

import ctypes
import gc
import os
import pickle
import signal
import sys
import traceback
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recv_handle

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to SIGKILL this process the moment its parent exits (a no-op elsewhere)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def thread_count() -> int:
    """Threads of this process, as the kernel counts them (a fork copies only the calling one)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # pragma: no cover - no /proc
        import threading

        return threading.active_count()


def _reap(conn: Connection, children: set[int]) -> None:
    """Collect every rank that has exited and tell the kernel its exit code."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        children.discard(pid)
        conn.send_bytes(pickle.dumps(("exited", pid, os.waitstatus_to_exitcode(status))))


def _become_rank(control: Connection, fd: int, log_path: str) -> None:
    """In the forked child: drop the template's duties, write to the rank's log, serve as a rank."""
    code = 1
    try:
        control.close()
        die_with_parent()  # the parent is now the template
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        from shardlib.runtime import worker

        code = worker.serve(Connection(fd))
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the kernel's to handle
    from shardlib.runtime import worker  # imports torch: every rank shares these pages

    conn = Connection(int(sys.argv[1]))
    settings = worker.read_settings(conn)
    if settings is None:
        return 0
    die_with_parent()
    parent_pid = settings["parent_pid"]
    # torch.autograd imports this (and sympy with it: 0.6 s, 35 MB) the first time a backward is handed its
    # output's gradient, as every pipeline stage and tensor-parallel backward is: imported once here, its
    # pages are shared by every rank instead of copied into each.
    import torch.fx.experimental.symbolic_shapes  # noqa: F401

    gc.collect()
    gc.freeze()  # keep the collector from touching (and so copying) the pages every rank shares
    conn.send_bytes(pickle.dumps(("ready", {"pid": os.getpid(), "threads": thread_count()})))
    children: set[int] = set()
    while os.getppid() == parent_pid:
        _reap(conn, children)
        if not wait([conn], timeout=0.2):
            continue
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if message == b"close":
            break
        request = pickle.loads(message)
        fd = recv_handle(conn)
        if thread_count() != 1:
            os.close(fd)
            conn.send_bytes(pickle.dumps(("refused", f"the template runs {thread_count()} threads; forking is unsafe")))
            continue
        pid = os.fork()
        if pid == 0:
            _become_rank(conn, fd, request["log_path"])
        os.close(fd)
        children.add(pid)
        conn.send_bytes(pickle.dumps(("spawned", pid)))
    for pid in children:  # the kernel is gone or closed us: take the ranks along
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
