"""Recorded collectives: every call on ``ctx.comm`` is logged as a ``CommRecord`` and drawn as a span.

The wrappers call ``torch.distributed`` and add a clock read and a list append, so a demo can say how many
collectives it issued, their buffer and wire bytes (``records``) and when. ``async_op=True`` (and
``isend`` / ``irecv``) returns a ``Pending``: the record spans the call's whole flight, and ``waited_s``
says how much of it the rank spent blocked in ``wait()``; the rest was hidden under its own work. On CUDA
every recorded call synchronises the device, so a span covers the work, not the launch. GPU tensors on a
gloo path are staged through host memory (``staging``); calls across an emulated slow link are held to
its time (``holding``).
"""

from __future__ import annotations

import threading
from time import perf_counter
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from shardlib.core.checks import choice, one_per
from shardlib.runtime.holding import Hold, sleep_until
from shardlib.runtime.records import CommRecord, wire_bytes
from shardlib.runtime.staging import nothing, stage_on_host

_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "product": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
               "min": dist.ReduceOp.MIN}

# torch renamed the tensor-in, tensor-out collectives; use whichever this version offers.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _reduce_op(op: str) -> dist.ReduceOp:
    return _REDUCE_OPS[choice(op, tuple(_REDUCE_OPS), "reduction")]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class Pending:
    """An asynchronous call in flight. ``wait()`` blocks until it is done, logs it, and returns its
    result (the reduced, gathered or received tensor); calling it again returns the same result."""

    def __init__(self, comm: "Comm", entry: tuple, work, finish: Callable[[], object], hold: "Hold | None" = None,
                 land: Callable[[], object] = nothing) -> None:
        self._comm, self._entry, self._work, self._finish, self._hold = comm, entry, work, finish, hold
        self._land = land  # copies a host-staged result back to the GPU
        self._done_s: list[float] = []
        self._result = None
        self._waited = False
        try:  # the backend tells us when the bytes arrived, if it can (collectives on gloo and NCCL)
            work.get_future().then(lambda fut: self._done_s.append(perf_counter()))
        except RuntimeError:  # point-to-point on gloo: completion is known only at wait()
            pass

    def wait(self):
        if self._waited:
            return self._result
        wait_s = perf_counter()
        self._work.wait()
        self._land()
        self._comm.ctx.sync()
        end_s = perf_counter()
        done_s = min(self._done_s[0], end_s) if self._done_s else end_s
        until_s = self._hold.until_s() if self._hold else None
        if until_s is not None:  # an emulated slow link: the bytes arrive no sooner than it lets them
            done_s = max(done_s, until_s)
            end_s = sleep_until(max(end_s, done_s))
        self._comm._log(*self._entry, done_s, waited_s=end_s - wait_s, emulated=self._hold is not None)
        if end_s - wait_s > 1e-6:
            self._comm.ctx.timeline.record(f"wait {self._entry[0]}", wait_s, end_s, "wait", group=self._entry[3])
        self._result, self._waited = self._finish(), True
        return self._result

    def is_completed(self) -> bool:
        return bool(self._work.is_completed())


class Comm:
    """The collectives of one rank, recorded. Reached as ``ctx.comm`` inside a rank function."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx  # the RankContext: rank, world_size, device, timeline
        self._entries: list[tuple] = []  # CommRecord fields, as tuples: cheap to append mid-collective
        self._group_names: dict[object, str] = {}
        # GPU tensors over gloo: every call goes through host memory (``_stage``). Tests turn this on
        # for CPU ranks too, to run the same copies where there is no GPU.
        self.host_staged = ctx.device.type == "cuda" and ctx.backend == "gloo"
        self._lock = threading.Lock()  # pipeline stages send and receive on helper threads
        self._emulation: Any = None
        self._crossing: dict = {}  # group -> whether its ranks span nodes, under the current emulation

    # -- bookkeeping ---------------------------------------------------------------------------
    def name_group(self, group: dist.ProcessGroup, name: str) -> None:
        """Label a process group so its calls are logged under ``name`` (e.g. ``"tp"``)."""
        self._group_names[group] = name

    def group_name(self, group: dist.ProcessGroup | None) -> str:
        """The label calls on ``group`` are logged under."""
        return "world" if group is None else self._group_names.get(group, "group")

    def group_size(self, group: dist.ProcessGroup | None) -> int:
        return self.ctx.world_size if group is None else dist.get_world_size(group)

    @property
    def records(self) -> list[CommRecord]:
        """This rank's calls since the start of the current ``run``, in order of completion."""
        return [CommRecord(*entry) for entry in self._entries]

    def clear(self) -> None:
        """Forget this call's records and any emulated link (the worker clears both before every call)."""
        self._entries.clear()
        self.emulate(None)

    def emulate(self, emulation: Any) -> None:
        """From now until the end of this call, hold every call whose ranks span nodes to the time the
        emulated link would take (``emulation``; ``None`` turns it off). Every rank must set the same."""
        if emulation is not None and len(emulation.node_of_rank) != self.ctx.world_size:
            raise ValueError(f"node_of_rank names {len(emulation.node_of_rank)} ranks but the job has "
                             f"{self.ctx.world_size}")
        self._emulation, self._crossing = emulation, {}

    def _hold(self, op: str, size_bytes: int, group, peer: int | None, start_s: float) -> "Hold | None":
        """For a call whose ranks span nodes under an emulated link, the ``Hold`` that makes it last as
        long as the link would; ``None`` for a call inside a node, or when nothing is emulated."""
        em = self._emulation
        if em is None:
            return None
        if peer is not None:
            crosses, n = em.crosses((self.ctx.rank, peer)), 2
        else:
            if group not in self._crossing:
                ranks = range(self.ctx.world_size) if group is None else dist.get_process_group_ranks(group)
                self._crossing[group] = em.crosses(ranks)
            crosses, n = self._crossing[group], self.group_size(group)
        return Hold(op, group, peer, start_s, em.time_s(op, size_bytes, n),
                     "cpu" if self.host_staged else self.ctx.device) if crosses else None

    def _log(self, op, size_bytes, wire, name, start_s, peer, end_s, waited_s=None, emulated=False) -> None:
        with self._lock:
            self._entries.append((op, size_bytes, end_s - start_s, name, self.ctx.rank, start_s, peer, wire, waited_s,
                                  emulated))
        self.ctx.timeline.record(op, start_s, end_s, "comm", size_bytes=size_bytes, wire_bytes=wire, group=name,
                                 peer=peer, emulated=emulated)

    def _call(self, op: str, size_bytes: int, group, call: Callable[..., object], *args, peer: int | None = None,
              wire: int | None = None, async_op: bool = False, finish: Callable[[], object] = lambda: None):
        """Run ``call(*args, group=group)`` and log it; with ``async_op`` return a ``Pending``. Kept
        lean: it sits around every collective."""
        self.ctx.sync()
        name = self.group_name(group)
        wire = wire_bytes(op, size_bytes, self.group_size(group)) if wire is None else wire
        start_s = perf_counter()
        hold = self._hold(op, size_bytes, group, peer, start_s) if self._emulation else None
        land = nothing
        if self.host_staged:
            args, land = stage_on_host(op, args)
        if async_op:
            work = call(*args, group=group, async_op=True)
            return Pending(self, (op, size_bytes, wire, name, start_s, peer), work, finish, hold, land)
        call(*args, group=group)
        land()
        self.ctx.sync()
        end_s = sleep_until(hold.until_s() if hold else None)
        self._log(op, size_bytes, wire, name, start_s, peer, end_s, emulated=hold is not None)
        return finish()

    # -- collectives ---------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", group=None, async_op: bool = False):
        """Combine ``tensor`` across the group, in place; every rank ends with the result."""
        return self._call("all_reduce", _nbytes(tensor), group, dist.all_reduce, tensor, _reduce_op(op),
                          async_op=async_op, finish=lambda: tensor)

    def broadcast(self, tensor: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
        """Copy rank ``src``'s ``tensor`` into every rank's ``tensor``, in place."""
        return self._call("broadcast", _nbytes(tensor), group, dist.broadcast, tensor, src, finish=lambda: tensor)

    def all_gather(self, tensor: torch.Tensor, dim: int = 0, group=None, async_op: bool = False):
        """Concatenate every rank's ``tensor`` along ``dim``, in rank order; all ranks get the result."""
        n = self.group_size(group)
        part = tensor.contiguous()
        out = torch.empty((n * part.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype, device=part.device)
        finish = (lambda: out) if dim == 0 else (lambda: torch.cat(out.chunk(n, dim=0), dim=dim))
        return self._call("all_gather", _nbytes(out), group, _all_gather_flat, out, part, async_op=async_op,
                          finish=finish)

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", dim: int = 0, group=None, async_op: bool = False):
        """Combine ``tensor`` across the group and give rank i the i-th of ``n`` equal chunks along ``dim``."""
        n = self.group_size(group)
        if tensor.shape[dim] % n:
            raise ValueError(f"reduce_scatter splits dim {dim} (size {tensor.shape[dim]}) into {n} equal chunks, "
                             f"one per rank, but {tensor.shape[dim]} is not divisible by {n}")
        flat = torch.cat(tensor.chunk(n, dim=dim), dim=0).contiguous() if dim != 0 else tensor.contiguous()
        chunk_shape = list(tensor.shape)
        chunk_shape[dim] //= n
        out = torch.empty([flat.shape[0] // n] + list(flat.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        finish = (lambda: out) if dim == 0 else (lambda: out.reshape(chunk_shape))
        return self._call("reduce_scatter", _nbytes(flat), group, _reduce_scatter_flat, out, flat, _reduce_op(op),
                          async_op=async_op, finish=finish)

    def all_to_all_single(self, tensor: torch.Tensor, input_split_sizes: Sequence[int] | None = None,
                          output_split_sizes: Sequence[int] | None = None, group=None, async_op: bool = False):
        """Send row block i of ``tensor`` (dim 0) to rank i; return the blocks received, in rank order.

        With no split sizes the rows are divided equally. With uneven splits, each rank must know how
        many rows it will receive: exchange the counts first (``exchange_counts``), then the rows.
        """
        n = self.group_size(group)
        if (input_split_sizes is None) != (output_split_sizes is None):
            raise ValueError("all_to_all_single needs both input_split_sizes and output_split_sizes, or neither; "
                             "get the output sizes from the input sizes with exchange_counts()")
        if input_split_sizes is None:
            if tensor.shape[0] % n:
                raise ValueError(f"an even all-to-all splits dim 0 (size {tensor.shape[0]}) into {n} equal blocks, "
                                 f"but {tensor.shape[0]} is not divisible by {n}")
            ins = outs = None
            rows_out, rows_away = tensor.shape[0], tensor.shape[0] - tensor.shape[0] // n
        else:
            ins = [int(s) for s in one_per(input_split_sizes, n, "input_split_sizes", "rank")]
            outs = [int(s) for s in one_per(output_split_sizes, n, "output_split_sizes", "rank")]
            if sum(ins) != tensor.shape[0]:
                raise ValueError(f"input_split_sizes add up to {sum(ins)} rows but the tensor has {tensor.shape[0]}")
            me = self.ctx.rank if group is None else dist.get_rank(group)
            rows_out, rows_away = sum(outs), sum(ins) - ins[me]
        inp = tensor.contiguous()
        out = torch.empty((rows_out,) + tuple(inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        row_bytes = inp[0].numel() * inp.element_size() if inp.shape[0] else 0
        return self._call("all_to_all_single", _nbytes(inp), group, dist.all_to_all_single, out, inp, outs, ins,
                          wire=rows_away * row_bytes, async_op=async_op, finish=lambda: out)

    def exchange_counts(self, counts: Sequence[int], group=None) -> list[int]:
        """Tell rank j how many rows this rank will send it (``counts[j]``); return how many each rank
        will send here. This is the first of the two all-to-alls of a token dispatch."""
        counts = one_per(counts, self.group_size(group), "exchange_counts", "rank")
        send = torch.tensor([int(c) for c in counts], dtype=torch.int64, device=self.ctx.device)
        return [int(c) for c in self.all_to_all_single(send, group=group).tolist()]

    # -- point to point ------------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None:
        """Send ``tensor`` to rank ``dst``; blocks until it has been received (gloo meets both ends)."""
        self._call("send", _nbytes(tensor), group, dist.send, tensor.contiguous(), dst, peer=dst)

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
        """Receive from rank ``src`` into ``tensor`` (same shape and dtype as sent)."""
        return self._call("recv", _nbytes(tensor), group, dist.recv, tensor, src, peer=src, finish=lambda: tensor)

    def isend(self, tensor: torch.Tensor, dst: int, group=None, tag: int = 0) -> Pending:
        """Start sending ``tensor`` to rank ``dst`` and return at once; ``wait()`` on the result. Two
        neighbours may both isend first and then irecv: neither blocks the other. Messages between two
        ranks meet their receives in order, per ``tag``."""
        data = tensor.contiguous()
        return self._call("send", _nbytes(data), group, _p2p(dist.isend, tag), data, dst, peer=dst, async_op=True)

    def irecv(self, tensor: torch.Tensor, src: int, group=None, tag: int = 0) -> Pending:
        """Start receiving from rank ``src`` into ``tensor``; ``wait()`` returns it once it has arrived."""
        return self._call("recv", _nbytes(tensor), group, _p2p(dist.irecv, tag), tensor, src, peer=src,
                          async_op=True, finish=lambda: tensor)

    def barrier(self, group=None) -> None:
        """Wait until every rank of the group has arrived."""
        self._call("barrier", 0, group, dist.barrier)


def _p2p(fn, tag: int = 0):
    """``dist.isend`` / ``dist.irecv`` are asynchronous by nature and take no ``async_op``."""
    return lambda *args, group=None, async_op=True: fn(*args, group=group, tag=tag)
