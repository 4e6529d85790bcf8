"""Recorded collectives: every call on ``ctx.comm`` is logged as (op, bytes, seconds, group).

The wrappers call ``torch.distributed`` directly and add only a clock read and a list append, so a demo
can say exactly how many collectives it issued and how much data they carried, and the timeline can
draw each one.

How bytes are counted (``size_bytes``) follows nccl-tests' convention, the size of the buffer the
operation works on, as seen by one rank:

=====================  ==========================================
all_reduce, broadcast  the tensor
all_gather             the whole gathered output (world x input)
reduce_scatter         the whole input (world x output)
all_to_all_single      the input this rank sends, all destinations
send, recv             the tensor
barrier                0
=====================  ==========================================

What actually crosses the wire depends on the algorithm (a ring all-reduce moves ``2(n-1)/n`` of the
buffer per rank) and on the backend: gloo builds all_gather and reduce_scatter on top of all-reduce, so
it moves more bytes than NCCL does for them. The cost models in ``costs.py`` turn these sizes into time.

On CUDA devices every recorded call synchronises the device before and after, so ``duration_s`` is the
collective's own time rather than the time to enqueue it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from time import perf_counter


_REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
}

# torch renamed the tensor-in, tensor-out collectives; use whichever this version offers.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class CommRecord:
    """One collective or point-to-point call, as one rank saw it."""

    op: str
    size_bytes: int
    duration_s: float
    group: str
    rank: int
    start_s: float
    peer: int | None = None  # the other rank of a send or recv


def _reduce_op(op: str | dist.ReduceOp) -> dist.ReduceOp:
    if isinstance(op, str):
        try:
            return _REDUCE_OPS[op]
        except KeyError:
            raise ValueError(f"unknown reduction {op!r}; use one of {sorted(_REDUCE_OPS)}") from None
    return op


class Comm:
    """The collectives of one rank, recorded. Reached as ``ctx.comm`` inside a rank function."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx  # the RankContext: rank, world_size, device, timeline
        self._entries: list[tuple] = []  # CommRecord fields, as tuples: cheap to append mid-collective
        self._group_names: dict[object, str] = {}
        self._cuda = ctx.device.type == "cuda"

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
        """This rank's calls since the start of the current ``run``, in order."""
        return [CommRecord(*entry) for entry in self._entries]

    def clear(self) -> None:
        self._entries.clear()

    def _timed(self, op: str, size_bytes: int, group, call: Callable[..., object], *args, peer: int | None = None):
        """Run ``call(*args, group=group)`` and log it. Kept lean: it sits around every collective."""
        if self._cuda:
            torch.cuda.synchronize(self.ctx.device)
        start_s = perf_counter()
        out = call(*args, group=group)
        if self._cuda:
            torch.cuda.synchronize(self.ctx.device)
        end_s = perf_counter()
        name = "world" if group is None else self._group_names.get(group, "group")
        self._entries.append((op, size_bytes, end_s - start_s, name, self.ctx.rank, start_s, peer))
        self.ctx.timeline.append(op, "comm", start_s, end_s, {"size_bytes": size_bytes, "group": name, "peer": peer})
        return out

    # -- collectives ---------------------------------------------------------------------------
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum", group=None) -> torch.Tensor:
        """Combine ``tensor`` across the group, in place; every rank ends with the result."""
        red = _reduce_op(op)
        self._timed("all_reduce", _nbytes(tensor), group, dist.all_reduce, tensor, red)
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0, group=None) -> torch.Tensor:
        """Copy rank ``src``'s ``tensor`` into every rank's ``tensor``, in place."""
        self._timed("broadcast", _nbytes(tensor), group, dist.broadcast, tensor, src)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = 0, group=None) -> torch.Tensor:
        """Concatenate every rank's ``tensor`` along ``dim``, in rank order; all ranks get the result."""
        n = self.group_size(group)
        part = tensor.contiguous()
        out = torch.empty((n * part.shape[0],) + tuple(part.shape[1:]), dtype=part.dtype, device=part.device)
        self._timed("all_gather", _nbytes(out), group, _all_gather_flat, out, part)
        return out if dim == 0 else torch.cat(out.chunk(n, dim=0), dim=dim)

    def reduce_scatter(self, tensor: torch.Tensor, op: str = "sum", dim: int = 0, group=None) -> torch.Tensor:
        """Combine ``tensor`` across the group and give rank i the i-th of ``n`` equal chunks along ``dim``."""
        n = self.group_size(group)
        if tensor.shape[dim] % n:
            raise ValueError(
                f"reduce_scatter splits dim {dim} (size {tensor.shape[dim]}) into {n} equal chunks, "
                f"one per rank, but {tensor.shape[dim]} is not divisible by {n}"
            )
        flat = torch.cat(tensor.chunk(n, dim=dim), dim=0).contiguous() if dim != 0 else tensor.contiguous()
        chunk_shape = list(tensor.shape)
        chunk_shape[dim] //= n
        out_shape = [flat.shape[0] // n] + list(flat.shape[1:])
        out = torch.empty(out_shape, dtype=tensor.dtype, device=tensor.device)
        red = _reduce_op(op)
        self._timed("reduce_scatter", _nbytes(flat), group, _reduce_scatter_flat, out, flat, red)
        return out.reshape(chunk_shape) if dim != 0 else out

    def all_to_all_single(
        self,
        tensor: torch.Tensor,
        input_split_sizes: Sequence[int] | None = None,
        output_split_sizes: Sequence[int] | None = None,
        group=None,
    ) -> torch.Tensor:
        """Send row block i of ``tensor`` (dim 0) to rank i; return the blocks received, in rank order.

        With no split sizes the rows are divided equally. With uneven splits, each rank must know how
        many rows it will receive: exchange the counts first (``exchange_counts``), then the rows.
        """
        n = self.group_size(group)
        if (input_split_sizes is None) != (output_split_sizes is None):
            raise ValueError(
                "all_to_all_single needs both input_split_sizes and output_split_sizes, or neither; "
                "get the output sizes from the input sizes with exchange_counts()"
            )
        if input_split_sizes is None:
            if tensor.shape[0] % n:
                raise ValueError(
                    f"an even all-to-all splits dim 0 (size {tensor.shape[0]}) into {n} equal blocks, "
                    f"but {tensor.shape[0]} is not divisible by {n}"
                )
            rows_out = tensor.shape[0]
        else:
            for label, sizes in (("input_split_sizes", input_split_sizes), ("output_split_sizes", output_split_sizes)):
                if len(sizes) != n:
                    raise ValueError(f"{label} has {len(sizes)} entries, one per rank is {n}")
            if sum(input_split_sizes) != tensor.shape[0]:
                raise ValueError(
                    f"input_split_sizes add up to {sum(input_split_sizes)} rows but the tensor has {tensor.shape[0]}"
                )
            rows_out = sum(output_split_sizes)
        inp = tensor.contiguous()
        out = torch.empty((rows_out,) + tuple(inp.shape[1:]), dtype=inp.dtype, device=inp.device)
        ins = None if input_split_sizes is None else [int(s) for s in input_split_sizes]
        outs = None if output_split_sizes is None else [int(s) for s in output_split_sizes]
        self._timed("all_to_all_single", _nbytes(inp), group, dist.all_to_all_single, out, inp, outs, ins)
        return out

    def exchange_counts(self, counts: Sequence[int], group=None) -> list[int]:
        """Tell rank j how many rows this rank will send it (``counts[j]``); return how many each rank
        will send here. This is the first of the two all-to-alls of a token dispatch."""
        n = self.group_size(group)
        if len(counts) != n:
            raise ValueError(f"exchange_counts needs one count per rank ({n}), got {len(counts)}")
        send = torch.tensor([int(c) for c in counts], dtype=torch.int64, device=self.ctx.device)
        return [int(c) for c in self.all_to_all_single(send, group=group).tolist()]

    def send(self, tensor: torch.Tensor, dst: int, group=None) -> None:
        """Point-to-point: send ``tensor`` to rank ``dst`` (blocks until it has been received)."""
        self._timed("send", _nbytes(tensor), group, dist.send, tensor.contiguous(), dst, peer=dst)

    def recv(self, tensor: torch.Tensor, src: int, group=None) -> torch.Tensor:
        """Point-to-point: receive from rank ``src`` into ``tensor`` (same shape and dtype as sent)."""
        self._timed("recv", _nbytes(tensor), group, dist.recv, tensor, src, peer=src)
        return tensor

    def barrier(self, group=None) -> None:
        """Wait until every rank of the group has arrived."""
        self._timed("barrier", 0, group, dist.barrier)

    # -- summaries -----------------------------------------------------------------------------
    def summary(self) -> dict[str, dict[str, float]]:
        """Per op: how many calls, how many bytes, how many seconds (this rank)."""
        return summarize(self.records)


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def summarize(records: Sequence[CommRecord]) -> dict[str, dict[str, float]]:
    """Per op: ``count``, ``size_bytes`` and ``duration_s``, summed over the records given."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        row = out.setdefault(r.op, {"count": 0, "size_bytes": 0, "duration_s": 0.0})
        row["count"] += 1
        row["size_bytes"] += r.size_bytes
        row["duration_s"] += r.duration_s
    return out


def format_log(records: Sequence[CommRecord]) -> str:
    """A plain-text table of records, one line each, for printing in a notebook."""
    lines = [f"{'rank':>4}  {'op':<18} {'group':<6} {'bytes':>12} {'time':>10}"]
    for r in sorted(records, key=lambda r: (r.start_s, r.rank)):
        lines.append(f"{r.rank:>4}  {r.op:<18} {r.group:<6} {r.size_bytes:>12,} {_fmt_s(r.duration_s):>10}")
    return "\n".join(lines)


def _fmt_s(seconds: float) -> str:
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
