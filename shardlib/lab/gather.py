"""``gather``: a pool's per-rank results, read field by field.

Every rank function returns a frozen dataclass; ``ranks.run`` returns one per rank, in rank order. A driver
then needs a few things from them, each one line here::

    got = gather(ranks.run(ep_forward_on_rank, x, weights, cfg, placement))
    got.each("expert_rows")        # (rank 0's, rank 1's, ...)
    got.sum("dispatch_bytes")      # summed over the ranks
    got.first("capacity")          # rank 0's (a value every rank holds)
    got.cat("output")              # the ranks' tensors joined along dim 0 (``dim=`` for another)
    got.each("forward_s", statistics.median)  # per rank, its repeats reduced
    got.across("end_s", max)       # per repeat, reduced over the ranks: (max of repeat 0, ...)
    got.max_gap("output", reference)           # largest |value - reference| over every rank

A rank outside the group a function needs returns ``None``: ``gather`` drops it. A field it lacks is a
``ValueError`` listing the fields there are.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Gathered:
    """The results of the ranks that took part, in rank order (see the module docstring)."""

    results: tuple

    def __post_init__(self) -> None:
        bad = [type(r).__name__ for r in self.results if not is_dataclass(r)]
        if bad:
            raise ValueError(f"gather reads rank functions' dataclasses; got {', '.join(sorted(set(bad)))}")

    def __len__(self) -> int:
        return len(self.results)

    def _values(self, name: str) -> list:
        if self.results and not hasattr(self.results[0], name):
            known = ", ".join(f.name for f in fields(self.results[0]))
            raise ValueError(f"{type(self.results[0]).__name__} has no field {name!r}; it has {known}")
        return [getattr(r, name) for r in self.results]

    def each(self, name: str, reduce: Callable[[Any], Any] | None = None) -> tuple:
        """``name`` of every rank, in rank order; with ``reduce``, ``reduce(value)`` of each (e.g. a
        median over the rank's repeats)."""
        values = self._values(name)
        return tuple(values if reduce is None else map(reduce, values))

    def sum(self, name: str):
        """``name`` summed over the ranks (numbers, or tensors of one shape)."""
        values = self._values(name)
        return sum(values[1:], values[0]) if values else 0

    def first(self, name: str):
        """The first rank's ``name``: for a value every rank holds alike."""
        if not self.results:
            raise ValueError(f"no rank returned a result, so there is no {name!r} to read")
        return self._values(name)[0]

    def cat(self, name: str, dim: int = 0) -> torch.Tensor:
        """The ranks' tensors ``name`` joined in rank order along ``dim``."""
        return torch.cat(self._values(name), dim=dim)

    def across(self, name: str, reduce: Callable[[Sequence], Any]) -> tuple:
        """For a field holding one value per repeat (every rank the same number): per repeat,
        ``reduce`` over the ranks' values, e.g. ``across("end_s", max)``, the last rank's end each time."""
        return tuple(reduce(per_repeat) for per_repeat in zip(*self._values(name)))

    def max_gap(self, name: str, reference: torch.Tensor) -> float:
        """The largest ``|value - reference|`` over every rank's tensor ``name``."""
        return max(float((v - reference).abs().max()) for v in self._values(name))


def gather(results: Sequence) -> Gathered:
    """``Gathered`` of ``ranks.run``'s per-rank results, the ``None`` of ranks that took no part dropped."""
    return Gathered(tuple(r for r in results if r is not None))
