"""Gathering what the ranks returned: frozen dataclasses read field by field across the ranks.

A rank function returns one frozen dataclass; ``ranks.run`` hands back one per rank, in rank order. A
driver reads them by field with ``fields_of``: one tuple per field, rank by rank, so the driver's own
dataclass takes whole columns instead of copying each field by hand. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Sequence


def fields_of(results: Sequence) -> dict[str, tuple]:
    """Per field of the ranks' results (dataclasses of one type), its values in rank order."""
    results = list(results)
    if not results:
        raise ValueError("no results to gather: the pool returned none")
    kinds = {type(r) for r in results}
    if len(kinds) != 1 or not is_dataclass(results[0]):
        raise ValueError(f"expected one dataclass type from every rank, got {sorted(k.__name__ for k in kinds)}")
    return {f.name: tuple(getattr(r, f.name) for r in results) for f in fields(results[0])}
