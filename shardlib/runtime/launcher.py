"""How a rank process comes to life: forked from the kernel's template, or spawned as a fresh Python.

``start_rank(method, ...)`` returns a handle (``pid``, ``poll``, ``kill``, ``wait``, ``parent_pid``: a
``ForkedRank`` or a ``subprocess.Popen``) and the socket the pool talks to the rank on. ``"template"``
(Linux): forked from this process's template (``template``), started by the first pool and kept, which
has torch imported already: a pool starts in a fraction of a second and its ranks share torch's pages.
``"spawn"``: ``python -m shardlib.runtime.worker FD``, a fresh interpreter importing torch itself (a
second or more per rank), where fork is not available, when asked for, or when the template cannot
start (with a warning saying why).
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
import queue
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import send_handle

from shardlib.core.checks import choice

START_METHODS = ("auto", "template", "spawn")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_method(method: str) -> str:
    """``"auto"``: the template on Linux (fork is safe there from a single-threaded parent), else spawn."""
    choice(method, START_METHODS, "start method")
    if method == "auto":
        forking = sys.platform.startswith("linux") and os.environ.get("SHARDLIB_START") != "spawn"
        return "template" if forking else "spawn"
    return method


def child_env(threads: int) -> dict:
    """This process's environment, with this package importable and ``threads`` threads per math library."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in [env.get("PYTHONPATH")] if p])
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    return env


def _start_python(module: str, fd: int, log, threads: int) -> subprocess.Popen:
    """``python -m module FD`` writing to ``log``, in a process group of its own: a Jupyter kernel asked to
    shut down terminates the children in its group and waits while any is listed (a dead one is, until this
    process reaps it), until its manager terminates the kernel 2.5 s later. The child dies with this process
    all the same (``template.die_with_parent``, ``worker._exit_with_parent``). Same session, so the same
    scheduling group as this process (Linux's autogroup); Python 3.10 has no ``process_group``: a session."""
    own_group = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
    return subprocess.Popen([sys.executable, "-m", module, str(fd)], pass_fds=[fd], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, env=child_env(threads), **own_group)


def sys_path() -> list[str]:
    """This process's import path, absolute: what a template or a rank puts first on its own."""
    return [os.path.abspath(p) if p else os.getcwd() for p in sys.path]


def log_tail(path: str, n_chars: int = 4000) -> str:
    """The last ``n_chars`` a process wrote to its log ``path``."""
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")[-n_chars:] or "(the process printed nothing)"
    except OSError:
        return "(no log)"


def first_reply(conn: Connection, log_path: str) -> tuple[str, object]:
    """A started process's first word: ``("ready", info)``, or ``("failed", why)`` (its log if it died)."""
    try:
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return "failed", log_tail(log_path)


class ForkedRank:
    """A rank forked from the template: its parent is the template, which reports its exit code."""

    def __init__(self, template: "Template", pid: int) -> None:
        self.template, self.pid, self.parent_pid = template, pid, template.pid

    def poll(self):
        return self.template.codes.get(self.pid)

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, 9)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float | None = None):
        """The exit code, once the template reports it (-9 if the template is gone: its ranks went with it)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.template.exited:
            while self.pid not in self.template.codes and self.template.alive():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"rank process {self.pid}", timeout)
                self.template.exited.wait(0.2 if left is None else min(left, 0.2))
            return self.template.codes.get(self.pid, -9)


class Template:
    """This process's side of the template: start it, ask it for ranks, hear when they exit.

    Made in two steps: the constructor starts the process and returns at once (the template imports
    torch meanwhile); ``wait_ready`` waits for it to say so. ``get_template`` does both."""

    def __init__(self) -> None:
        self._logdir = tempfile.TemporaryDirectory(prefix="shardlib-template-")
        parent_end, child_end = socket.socketpair()
        self._log_path = os.path.join(self._logdir.name, "template.log")
        with open(self._log_path, "ab") as log:
            self.proc = _start_python("shardlib.runtime.template", child_end.fileno(), log, 1)
        child_end.close()
        self.pid, self.owner_pid = self.proc.pid, os.getpid()
        self.conn = Connection(parent_end.detach())
        self._lock = threading.Lock()
        self.codes: dict[int, int] = {}  # pid -> exit code of each rank that has exited
        self.exited = threading.Condition()  # notified when one does, or the template is gone
        self._answers: queue.Queue = queue.Queue()
        self.info: dict | None = None  # the template's ``ready`` message, once it came
        self.conn.send_bytes(pickle.dumps({"parent_pid": os.getpid(), "sys_path": sys_path()}))

    def wait_ready(self, start_timeout_s: float) -> None:
        """Wait until the template has torch imported (at most ``start_timeout_s``); a ``RuntimeError``
        saying why if it does not get there (it is closed then)."""
        if self.info is not None:
            return
        if not wait([self.conn], timeout=start_timeout_s):
            self.close()
            raise RuntimeError(f"the template did not start within {start_timeout_s:.0f} s")
        status, info = first_reply(self.conn, self._log_path)
        if status != "ready":
            self.close()
            raise RuntimeError(f"the template failed to start:\n{info}")
        self.info = info
        threading.Thread(target=self._listen, name="shardlib-template", daemon=True).start()

    def _listen(self) -> None:
        while True:
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError):
                with self.exited:
                    self.exited.notify_all()
                self._answers.put(("gone", None))
                return
            if message[0] == "exited":
                with self.exited:
                    self.codes[message[1]] = message[2]
                    self.exited.notify_all()
            else:
                self._answers.put(message)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, fd: int, log_path: str, timeout_s: float = 30.0) -> int:
        """Fork a rank that serves on ``fd`` and writes to ``log_path``; return its pid."""
        with self._lock:
            self.conn.send_bytes(pickle.dumps({"log_path": log_path}))
            send_handle(self.conn, fd, self.pid)
            try:
                kind, value = self._answers.get(timeout=timeout_s)
            except queue.Empty:
                raise RuntimeError(f"the template did not answer within {timeout_s:.0f} s") from None
        if kind != "spawned":
            raise RuntimeError(f"the template could not start a rank: {value or log_tail(self._log_path)}")
        return value

    def close(self) -> None:
        try:
            self.conn.send_bytes(b"close")
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.conn.close()


_TEMPLATE: Template | None = None
_FROZEN_AT_EXIT = False
_TEMPLATE_LOCK = threading.Lock()


def _current() -> Template | None:
    """This process's template, if one is started and alive (a forked child's inherited one is not its own)."""
    if _TEMPLATE is not None and _TEMPLATE.alive() and _TEMPLATE.owner_pid == os.getpid():
        return _TEMPLATE
    return None


def get_template(start_timeout_s: float) -> Template | None:
    """This process's template, started on first use (and again if it died), ready to fork ranks; ``None``
    if it cannot start, after a warning saying why."""
    global _TEMPLATE
    with _TEMPLATE_LOCK:
        try:
            template = _current() or Template()
            _TEMPLATE = template
            template.wait_ready(start_timeout_s)
        except (RuntimeError, OSError) as exc:
            warnings.warn(f"rank processes will start as fresh Pythons (slower): {exc}", RuntimeWarning, stacklevel=3)
            _TEMPLATE = None
        return _TEMPLATE


def start_template() -> bool:
    """Start this process's template now and return without waiting for it: the template imports torch
    (seconds on a laptop) while this process goes on, and the first pool (``Ranks``) finds it ready
    instead of starting it. A notebook calls it in its first cell. Does nothing where pools start ranks
    as fresh Pythons (``resolve_method``), or a template is already started. Whether it started one.

    It also makes this process's exit skip its last garbage collection (``gc.freeze`` at exit): with torch
    imported it takes about 0.6 s, to free memory the system takes back anyway, and a kernel restart waits."""
    global _TEMPLATE, _FROZEN_AT_EXIT
    if not _FROZEN_AT_EXIT:
        atexit.register(gc.freeze)  # registered last, so run first: every other handler still runs after it
        _FROZEN_AT_EXIT = True
    if resolve_method("auto") != "template":
        return False
    with _TEMPLATE_LOCK:
        if _current() is not None:
            return False
        try:
            _TEMPLATE = Template()
        except OSError:  # the first pool tries again, and warns if it cannot
            return False
        return True


@atexit.register
def _close_template() -> None:
    if _TEMPLATE is not None and _TEMPLATE.alive():
        _TEMPLATE.close()


def start_rank(method: str, threads: int, log_path: str, start_timeout_s: float):
    """Start one rank process by ``method`` (resolved: ``"template"`` or ``"spawn"``). Returns
    ``(handle, connection)``; the rank waits on the connection for its settings."""
    parent_end, child_end = socket.socketpair()
    try:
        template = get_template(start_timeout_s) if method == "template" else None
        if template is not None:
            handle = ForkedRank(template, template.spawn(child_end.fileno(), log_path))
        else:
            with open(log_path, "ab") as log:
                handle = _start_python("shardlib.runtime.worker", child_end.fileno(), log, threads)
            handle.parent_pid = os.getpid()  # a Popen: poll, kill and wait as a ForkedRank
    finally:
        child_end.close()
    return handle, Connection(parent_end.detach())


def kill_ranks(procs: list) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process stuck in the kernel
            pass
