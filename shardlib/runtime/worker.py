"""The rank process: forked from the template (``template``), or started as ``python -m
shardlib.runtime.worker FD``.

It joins the process group once, then serves calls until its parent closes the pool or goes away. Being
a module of its own (rather than a function handed to ``multiprocessing``) means a rank never re-imports
the user's ``__main__``: a notebook, a test or a script without an ``if __name__ == "__main__":`` guard
all start ranks the same way.

Wire protocol, on one socket to the parent (``multiprocessing.connection`` framing):

* parent -> rank, once: the pickled start-up settings; rank -> parent: ``("ready", info)`` or
  ``("failed", traceback)``.
* parent -> rank, per call: ``cloudpickle((fn, args, kwargs))``; rank -> parent: ``("ok", result,
  comm records, spans, printed text)`` or ``("err", summary, traceback, printed text)``.
* parent -> rank: ``b"close"`` to leave the process group and exit.
"""

from __future__ import annotations

import ctypes
import io
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from datetime import timedelta
from multiprocessing.connection import Connection

import cloudpickle
import torch
import torch.distributed as dist

from shardlib.runtime.context import RankContext, prepare_device, use_loopback_for_gloo

# glibc's malloc_trim: after a call, the heap's free pages go back to the system. Without it a call's freed
# tensors (a sweep's buffers, a layout's activations) stay in each rank's heap: a notebook's four ranks held
# about 100 MB more after its step-time cells than they used. None where the C library has none (macOS, musl).
try:
    _MALLOC_TRIM = ctypes.CDLL(None).malloc_trim
except (OSError, AttributeError):
    _MALLOC_TRIM = None


def _exit_with_parent(parent_pid: int, poll_s: float = 0.2) -> None:
    """Leave as soon as the parent is gone (even SIGKILLed): no orphan outlives a kernel."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, name="shardlib-parent-watch", daemon=True).start()


def _join(cfg: dict) -> RankContext:
    rank, world_size, backend = cfg["rank"], cfg["world_size"], cfg["backend"]
    torch.set_num_threads(cfg["threads"])
    device = prepare_device(cfg["device"])  # "cpu", or this rank's GPU (its own, or shared): see devices
    if backend == "gloo":
        use_loopback_for_gloo()
    store = dist.TCPStore(
        cfg["store_host"], cfg["store_port"], world_size, is_master=False,
        timeout=timedelta(seconds=cfg["start_timeout_s"]),
    )
    dist.init_process_group(
        backend, store=dist.PrefixStore(cfg["store_prefix"], store), rank=rank, world_size=world_size,
        timeout=timedelta(seconds=cfg["op_timeout_s"]),
    )
    ctx = RankContext(rank, world_size, device, backend)
    dist.barrier()  # every rank is connected before the pool reports ready
    return ctx


def _to_host(value):
    """Results travel to the parent on CPU and without autograd history."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "wait"):
            value = value.wait()  # an asynchronous collective's result (e.g. from DTensor): finish it first
        return value.detach().cpu() if (value.device.type != "cpu" or value.requires_grad) else value
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_host(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    return value


def _call(ctx: RankContext, payload: bytes) -> bytes:
    ctx.comm.clear()
    ctx.timeline.clear()
    printed = io.StringIO()
    try:
        fn, args, kwargs = cloudpickle.loads(payload)
    except BaseException as exc:  # e.g. a module importable in the parent but not here
        return pickle.dumps(("err", f"rank {ctx.rank} could not load the function: {exc!r}",
                             traceback.format_exc(), ""))
    try:
        with redirect_stdout(printed), redirect_stderr(printed):
            result = fn(ctx, *args, **kwargs)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # from the function's frame
        return pickle.dumps(("err", f"rank {ctx.rank} raised {type(exc).__name__}: {exc}",
                             "".join(traceback.format_exception(type(exc), exc, tb)), printed.getvalue()))
    reply = ("ok", _to_host(result), ctx.comm.records, ctx.timeline.spans, printed.getvalue())
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        pass  # e.g. a function or lambda in the result: cloudpickle can send those
    try:
        return cloudpickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:
        return pickle.dumps(("err", f"rank {ctx.rank} returned a {type(result).__name__} that cannot be "
                             f"sent back to the notebook: {exc}", traceback.format_exc(), printed.getvalue()))


def read_settings(conn: Connection) -> dict | None:
    """The settings the parent sends first (``None`` if it went away), its import path taken on; from
    now on an interrupt is the parent's to handle."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        settings = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return None
    sys.path[:] = settings["sys_path"] + [p for p in sys.path if p not in settings["sys_path"]]
    return settings


def serve(conn: Connection) -> int:
    """Be a rank on ``conn`` until the pool closes or the parent goes away (see the module docstring)."""
    cfg = read_settings(conn)
    if cfg is None:
        return 0
    _exit_with_parent(cfg["parent_pid"])
    try:
        ctx = _join(cfg)
    except BaseException:
        conn.send_bytes(pickle.dumps(("failed", traceback.format_exc())))
        return 1
    conn.send_bytes(pickle.dumps(("ready", {"pid": os.getpid(), "device": str(ctx.device),
                                            "threads": torch.get_num_threads()})))
    while True:
        try:
            payload = conn.recv_bytes()
        except (EOFError, OSError):
            break
        if payload == b"close":
            break
        conn.send_bytes(_call(ctx, payload))
        if _MALLOC_TRIM is not None:
            _MALLOC_TRIM(0)  # after the reply, so the call's round trip does not wait for it
    try:
        dist.destroy_process_group()
    finally:
        os._exit(0)


if __name__ == "__main__":
    sys.exit(serve(Connection(int(sys.argv[1]))))
