"""The two checks every config and formula makes of its numbers, with messages that show the value."""

from __future__ import annotations

from numbers import Integral, Real


def whole_number(value, what: str, minimum: int = 1) -> int:
    """``value`` as an int, or a ValueError: "``what`` must be a whole number of at least ``minimum``"."""
    if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
        raise ValueError(f"{what} must be a whole number of at least {minimum}, got {value!r}")
    return int(value)


def same_dtype(given, expected, what: str) -> None:
    """A ValueError when ``what`` (a tensor's dtype) is not the weights' dtype, saying how to convert it."""
    if given != expected:
        raise ValueError(f"{what} is {given} but the weights are {expected}: convert it first, "
                         f"for example x.to({expected})")


def positive_number(value, what: str) -> float:
    """``value`` as a float, or a ValueError: "``what`` must be a positive number"."""
    if isinstance(value, bool) or not isinstance(value, Real) or not value > 0:
        raise ValueError(f"{what} must be a positive number, got {value!r}")
    return float(value)
