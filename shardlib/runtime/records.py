"""What the comm log holds (pure: no torch): one ``CommRecord`` per call with two byte counts, and summaries.

``size_bytes`` is nccl-tests' size (the buffer, as one rank sees it); ``wire_bytes`` is what this rank
puts on the wire under the bandwidth-optimal ring (Patarasuk and Yuan 2009), behind nccl-tests' bus
bandwidth:

=================  ======================================  ==================================
op                 size_bytes                              wire_bytes (per rank, ring)
=================  ======================================  ==================================
all_reduce         the tensor                              2(n-1)/n x size
all_gather         the gathered output (n x input)         (n-1)/n x size
reduce_scatter     the whole input (n x output)            (n-1)/n x size
all_to_all_single  what this rank sends                    the rows it sends to other ranks
broadcast, send    the tensor                              size (recv and non-roots: 0)
=================  ======================================  ==================================
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

RING_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "all_to_all_single": lambda n: (n - 1) / n,
                "broadcast": lambda n: 1.0, "send": lambda n: 1.0, "recv": lambda n: 0.0, "barrier": lambda n: 0.0}


@dataclass(frozen=True)
class CommRecord:
    """One collective or point-to-point call, as one rank saw it. ``duration_s`` runs from the call to
    its completion; for an asynchronous call, ``waited_s`` is the part the rank spent blocked in
    ``wait()`` (the rest was hidden under whatever it did meanwhile); ``None`` for a blocking call."""

    op: str
    size_bytes: int
    duration_s: float
    group: str
    rank: int
    start_s: float
    peer: int | None = None  # the other rank of a send or recv
    wire_bytes: int = 0
    waited_s: float | None = None
    emulated: bool = False  # held to an emulated slow link's time (``emulation``)


def wire_bytes(op: str, size_bytes: int, n: int) -> int:
    """Bytes one rank sends for ``op`` on a buffer of ``size_bytes`` over ``n`` ranks, ring convention
    (see the module docstring). One rank sends nothing."""
    if op not in RING_FACTORS:
        raise ValueError(f"no wire count for {op!r}; known: {', '.join(RING_FACTORS)}")
    if n <= 1 and op != "send":
        return 0
    return int(round(RING_FACTORS[op](n) * size_bytes))


def summarize(records: Sequence[CommRecord]) -> dict[str, dict[str, float]]:
    """Per op: ``count``, ``size_bytes``, ``wire_bytes`` and ``duration_s``, summed over the records."""
    out: dict[str, dict[str, float]] = {}
    for r in records:
        row = out.setdefault(r.op, {"count": 0, "size_bytes": 0, "wire_bytes": 0, "duration_s": 0.0})
        row["count"] += 1
        row["size_bytes"] += r.size_bytes
        row["wire_bytes"] += r.wire_bytes
        row["duration_s"] += r.duration_s
    return out


def format_log(records: Sequence[CommRecord]) -> str:
    """A plain-text table of records, one line each, for printing in a notebook."""
    lines = [f"{'rank':>4}  {'op':<18} {'group':<6} {'buffer bytes':>13} {'wire bytes':>12} {'time':>10}"]
    for r in sorted(records, key=lambda r: (r.start_s, r.rank)):
        lines.append(f"{r.rank:>4}  {r.op:<18} {r.group:<6} {r.size_bytes:>13,} {r.wire_bytes:>12,} "
                     f"{format_seconds(r.duration_s):>10}")
    return "\n".join(lines)


def format_seconds(seconds: float) -> str:
    """``seconds`` in the unit a person reads best: us, ms or s."""
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
