"""The one measurement harness: a function run on every rank, and what came back, read in one place.

``on_ranks(ranks, fn, *args, repeats=3)`` calls ``fn(ctx, *args)`` on every rank ``repeats`` times, each
after a barrier, and returns one ``Measured``: what each rank's ``fn`` returned, its comm log and its
timeline spans, each repeat's on its own, and each repeat's start and end on the shared clock. The
mechanism never knows it is measured; a rank function is the core call and nothing else::

    got = on_ranks(ranks, my_rank_fn, x, repeats=3)
    got.each("output"), got.cat("output"), got.sum("dropped"), got.first("capacity")  # in rank order
    got.bytes("all_reduce"), got.bytes(wire=True, rank=0, repeat=0), got.count("all_to_all_single")
    got.step_s(), got.spans("experts")  # per repeat: last end - first start; the spans of that name
    got.within(got.spans("forward", rank=0)[0])  # the records rank 0 issued inside its forward span

``Measured.of(values)`` reads results a caller gathered itself. A rank outside the group a function needs
returns ``None``: its values are dropped. A field a value lacks is a ``ValueError`` listing what it has.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist


def _repeated_on_rank(ctx, fn, repeats: int, args: tuple, kwargs: dict) -> tuple:
    """``fn`` ``repeats`` times after a barrier each: (values per repeat, (start_s, end_s) per repeat). The
    barrier is not logged: the comm log holds what ``fn`` sent and nothing else."""
    values, times = [], []
    for _ in range(repeats):
        dist.barrier()
        start_s = ctx.now_s()
        values.append(fn(ctx, *args, **kwargs))
        times.append((start_s, ctx.now_s()))
    return tuple(values), tuple(times)


def on_ranks(ranks, fn, *args, repeats: int = 1, **kwargs) -> "Measured":
    """Run ``fn(ctx, *args, **kwargs)`` on every rank of ``ranks`` ``repeats`` times (a barrier before
    each) and gather it (see the module docstring)."""
    if not isinstance(repeats, int) or isinstance(repeats, bool) or repeats < 1:
        raise ValueError(f"repeats must be a whole number of at least 1, got {repeats!r}")
    replies = ranks.run(_repeated_on_rank, fn, repeats, args, kwargs)
    kept = [(rank, reply) for rank, reply in enumerate(replies) if reply[0][-1] is not None]
    return Measured(tuple(v for _, (v, _) in kept), tuple(r for r, _ in kept), tuple(ranks.last_comm),
                    tuple(ranks.last_spans), tuple(times for _, times in replies))


def _read(value, name: str | None):
    if name is None:
        return value
    if isinstance(value, dict):
        if name not in value:
            raise ValueError(f"the ranks returned no {name!r}; they returned {', '.join(map(str, value))}")
        return value[name]
    if not hasattr(value, name):
        known = ", ".join(f.name for f in fields(value)) if is_dataclass(value) else ", ".join(
            n for n in dir(value) if not n.startswith("_"))
        raise ValueError(f"{type(value).__name__} has no field {name!r}; it has {known}")
    return getattr(value, name)


@dataclass(frozen=True)
class Measured:
    """What every rank returned from each repeat (``per_repeat[i]``: rank ``ranks[i]``'s values, one a
    repeat), the comm log and spans of every repeat, and every repeat's (start, end) per rank."""

    per_repeat: tuple  # (ranks taking part,) each (repeats,) of what fn returned
    ranks: tuple[int, ...] = ()
    comm: tuple = ()  # CommRecord, every repeat's, every rank
    timeline: tuple = ()  # Span, every repeat's, every rank
    times_s: tuple = ()  # (world_size,) each (repeats,) of (start_s, end_s)

    @classmethod
    def of(cls, values: Sequence) -> "Measured":
        """Results a caller gathered itself, one per rank (``None`` for a rank that took no part)."""
        return cls(tuple((v,) for v in values if v is not None),
                   tuple(r for r, v in enumerate(values) if v is not None))

    def __len__(self) -> int:
        return len(self.per_repeat)

    @property
    def values(self) -> tuple:
        """The last repeat's value of each rank that took part."""
        return tuple(vs[-1] for vs in self.per_repeat)

    # -- what the ranks returned -------------------------------------------------------------------------
    def each(self, name: str | None = None, reduce: Callable[[Any], Any] | None = None) -> tuple:
        """``name`` of every rank (the last repeat's), in rank order; with ``reduce``, ``reduce`` of each."""
        values = [_read(v, name) for v in self.values]
        return tuple(values if reduce is None else map(reduce, values))

    def each_repeat(self, name: str | None = None) -> tuple:
        """Per rank, ``name`` of each repeat: ``((rank 0's, repeat 0, 1, ...), (rank 1's ...), ...)``."""
        return tuple(tuple(_read(v, name) for v in vs) for vs in self.per_repeat)

    def sum(self, name: str | None = None):
        """``name`` summed over the ranks (numbers, or tensors of one shape)."""
        values = self.each(name)
        return sum(values[1:], values[0]) if values else 0

    def first(self, name: str | None = None):
        """The first rank's ``name``: for a value every rank holds alike."""
        if not self.per_repeat:
            raise ValueError(f"no rank returned a result, so there is no {name!r} to read")
        return _read(self.values[0], name)

    def cat(self, name: str | None = None, dim: int = 0) -> torch.Tensor:
        """The ranks' tensors ``name`` joined in rank order along ``dim``."""
        return torch.cat(self.each(name), dim=dim)

    def across(self, name: str, reduce: Callable[[Sequence], Any]) -> tuple:
        """For a field holding one value per repeat (every rank the same number): per repeat, ``reduce``
        over the ranks' values, e.g. ``across("end_s", max)``, the last rank's end each time."""
        return tuple(reduce(per_repeat) for per_repeat in zip(*self.each(name)))

    def max_gap(self, name: str | None, reference: torch.Tensor) -> float:
        """The largest ``|value - reference|`` over every rank's tensor ``name``."""
        return max(float((v - reference).abs().max()) for v in self.each(name))

    # -- what they sent ----------------------------------------------------------------------------------
    def _in(self, item, rank: int | None, repeat: int | None) -> bool:
        if rank is not None and item.rank != rank:
            return False
        if repeat is None or not self.times_s:
            return True
        start_s, end_s = self.times_s[item.rank][repeat]
        return start_s <= item.start_s <= end_s

    def records(self, op: str | None = None, rank: int | None = None, repeat: int | None = -1) -> tuple:
        """The comm records of ``op`` issued by ``rank`` in ``repeat`` (``None``: any op, every rank,
        every repeat), in the order each rank logged them."""
        return tuple(r for r in self.comm if (op is None or r.op == op) and self._in(r, rank, repeat))

    def within(self, span) -> tuple:
        """The comm records ``span``'s rank issued while ``span`` was open (e.g. a ``forward`` span)."""
        return tuple(r for r in self.comm if r.rank == span.rank and span.start_s <= r.start_s <= span.end_s)

    def bytes(self, op: str | None = None, rank: int | None = None, wire: bool = False,
              repeat: int | None = -1) -> int:
        """Buffer bytes (``wire``: bytes on the wire under the ring) of those records, summed."""
        return sum(r.wire_bytes if wire else r.size_bytes for r in self.records(op, rank, repeat))

    def count(self, op: str | None = None, rank: int | None = None, repeat: int | None = -1) -> int:
        return len(self.records(op, rank, repeat))

    # -- when ------------------------------------------------------------------------------------------------
    def spans(self, name: str | None = None, rank: int | None = None, repeat: int | None = -1) -> tuple:
        """The spans called ``name`` on ``rank`` in ``repeat`` (``None``: every name, rank, repeat), by start."""
        return tuple(sorted((s for s in self.timeline if (name is None or s.name == name)
                             and self._in(s, rank, repeat)), key=lambda s: (s.start_s, s.rank)))

    def elapsed_s(self, rank: int) -> tuple[float, ...]:
        """Per repeat, ``rank``'s seconds from its start to its end."""
        return tuple(end - start for start, end in self.times_s[rank])

    def step_s(self) -> tuple[float, ...]:
        """Per repeat, the last rank's end minus the first rank's start."""
        return tuple(max(e for _, e in per) - min(s for s, _ in per) for per in zip(*self.times_s))
