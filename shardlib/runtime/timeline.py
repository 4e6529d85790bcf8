"""Spans recorded on each rank, on one clock, for Gantt charts.

A span is a named interval of one rank's time: a compute step, a collective, a wait. Every rank stamps
its spans with ``time.perf_counter()``, which on Linux and macOS reads the machine-wide monotonic clock,
so spans recorded by different processes on one machine can be laid on one axis without any
synchronisation step. (Across machines, under ``torchrun``, each host has its own clock: compare spans
within a host, or subtract each rank's own start.)

On a GPU, work is queued and runs later: a clock read right after a line of GPU code measures its
launch, not its work. A ``Timeline`` given ``sync`` (the rank's ``ctx.sync``, which waits for its GPU)
calls it before reading the clock at each end of a ``span`` and in ``now_s``, so a span covers the
work. On CPU there is nothing to wait for and ``sync`` is ``None``.

This module is pure: no torch (nor ``torch.distributed``).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping


def now_s() -> float:
    """The shared clock: seconds from an arbitrary origin, comparable across processes on one machine."""
    return time.perf_counter()


@dataclass(frozen=True)
class Span:
    """One interval of one rank's time. ``kind`` is ``"compute"``, ``"comm"``, ``"wait"`` or a name of
    your own; ``attrs`` carries whatever the recorder attached (a microbatch index, a byte count)."""

    rank: int
    name: str
    kind: str
    start_s: float
    end_s: float
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.end_s < self.start_s:
            raise ValueError(
                f"span {self.name!r} on rank {self.rank} ends ({self.end_s:.6f} s) before it starts "
                f"({self.start_s:.6f} s)"
            )

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


class Timeline:
    """The spans one rank records during one ``Ranks.run`` call (cleared before each call).

    Entries are kept as plain tuples and turned into ``Span`` objects only when read: recording sits
    next to collectives that take microseconds, and building an object there would show in their time.
    """

    def __init__(self, rank: int, sync: Callable[[], None] | None = None) -> None:
        self.rank = rank
        self._sync = sync  # waits for the rank's GPU before a clock read (None on CPU)
        self._entries: list[tuple] = []  # (name, kind, start_s, end_s, attrs)

    def now_s(self) -> float:
        """The shared clock, read once the rank's queued GPU work (if any) has finished: use it, not
        ``time.perf_counter()``, to time GPU work for ``record``."""
        if self._sync is not None:
            self._sync()
        return time.perf_counter()

    @property
    def spans(self) -> list[Span]:
        return [Span(self.rank, *entry) for entry in self._entries]

    def record(self, name: str, start_s: float, end_s: float, kind: str = "compute", **attrs: Any) -> None:
        if end_s < start_s:
            raise ValueError(f"span {name!r} ends ({end_s:.6f} s) before it starts ({start_s:.6f} s)")
        self._entries.append((name, kind, start_s, end_s, attrs))

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs: Any) -> Iterator[None]:
        """Record the time spent inside the ``with`` block as one span (on a GPU, the work queued inside
        it included: see the module docstring)."""
        start_s = self.now_s()
        try:
            yield
        finally:
            self.record(name, start_s, self.now_s(), kind, **attrs)

    def clear(self) -> None:
        self._entries.clear()


def shift_to_zero(spans: list[Span], origin_s: float | None = None) -> list[Span]:
    """The same spans with times measured from ``origin_s`` (default: the earliest start)."""
    origin = min((s.start_s for s in spans), default=0.0) if origin_s is None else origin_s
    return [replace(s, start_s=s.start_s - origin, end_s=s.end_s - origin) for s in spans]
