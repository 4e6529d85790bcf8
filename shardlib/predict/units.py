"""How the planners write numbers: bytes in GB (or MB, kB), seconds in ms (or s). Pure: no torch."""

from __future__ import annotations


def gb(size_bytes: float) -> str:
    """Bytes in GB (or MB, or kB), as the planner prints them."""
    if size_bytes >= 1e9:
        return f"{size_bytes / 1e9:.1f} GB"
    return f"{size_bytes / 1e6:.0f} MB" if size_bytes >= 1e6 else f"{size_bytes / 1e3:,.0f} kB"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 0.1 else f"{seconds * 1e3:,.0f} ms"


def seconds(x: float) -> str:
    return f"{x:,.2f} s" if x >= 1 else ms(x)
