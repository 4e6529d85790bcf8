"""The argument checks every config, formula and driver makes, with messages that show the value.

Each check returns the value (converted: ``int``, ``float``) or raises ``ValueError`` saying what was
expected, in the learner's terms, and what was given. ``True`` and ``False`` are refused as numbers
(``bool`` is an ``int`` subclass in Python, and ``tp=True`` is a mistake, not a 1). ``near_equal_parts``
is the one way the package splits a count into parts that differ by at most one. Pure: no torch.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Sequence

TOLERANCE = 1e-5  # rtol = atol: a cross-rank sum adds partials in another order than one process adds them


def is_number(value, kind=Real) -> bool:
    """Whether ``value`` is a number of ``kind`` (``Real`` or ``Integral``), ``True`` and ``False`` not counted."""
    t = type(value)  # int and float first: an ABC's isinstance is slow, and the planners call this often
    return t is int or (t is float and kind is Real) or (t is not bool and isinstance(value, kind))


def _within(value, what: str, kind, low: float, high: float, low_open: bool, expected: str):
    """``value`` as an int (``Integral``) or float (``Real``) if it lies from ``low`` (excluded when
    ``low_open``) to ``high``; otherwise "``what`` must be ``expected``, got ``value``"."""
    if not is_number(value, kind) or not (value > low if low_open else value >= low) or not value <= high:
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    return int(value) if kind is Integral else float(value)


def whole_number(value, what: str, minimum: int = 1) -> int:
    """``value`` as an int, or "``what`` must be a whole number of at least ``minimum``"."""
    return value if type(value) is int and value >= minimum else _within(  # an int: no slow ABC check
        value, what, Integral, minimum, math.inf, False, f"a whole number of at least {minimum}")


def whole_number_between(value, what: str, low: int, high: int) -> int:
    """``value`` as an int from ``low`` to ``high`` (both included)."""
    return _within(value, what, Integral, low, high, False, f"a whole number from {low} to {high}")


def positive_number(value, what: str) -> float:
    """``value`` as a float above zero."""
    return _within(value, what, Real, 0, math.inf, True, "a positive number")


def number_at_least(value, what: str, minimum: float = 0.0) -> float:
    """``value`` as a float of at least ``minimum`` (zero by default: a duration, a latency)."""
    return _within(value, what, Real, minimum, math.inf, False, f"a number of at least {minimum:g}")


def number_between(value, what: str, low: float, high: float) -> float:
    """``value`` as a float from ``low`` to ``high`` (both included)."""
    return _within(value, what, Real, low, high, False, f"a number from {low:g} to {high:g}")


def flag(value, what: str) -> bool:
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, got {value!r}")
    return value


def choice(value, allowed: Sequence, what: str):
    """``value`` if it is one of ``allowed``."""
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; use one of {', '.join(map(repr, allowed))}")
    return value


def one_per(values, count: int, what: str, each: str) -> list:
    """``values`` as a list of exactly ``count`` entries (``each`` names one entry: "stage", "rank")."""
    values = list(values)
    if len(values) != count:
        raise ValueError(f"{what} needs one entry per {each} ({count}), got {len(values)}")
    return values


def same_dtype(given, expected, what: str) -> None:
    """A ValueError when ``what`` (a tensor's dtype) is not the weights' dtype, saying how to convert it."""
    if given != expected:
        raise ValueError(f"{what} is {given} but the weights are {expected}: convert it first, "
                         f"for example x.to({expected})")


def near_equal_parts(n: int, k: int) -> tuple[int, ...]:
    """``n`` cut into ``k`` whole parts that differ by at most one, the earlier parts taking the extra
    (as ``torch.tensor_split`` cuts): layers into stages, rows into microbatches, tokens into ranks."""
    n, k = whole_number(n, "the number to split", minimum=0), whole_number(k, "the number of parts")
    base, extra = divmod(n, k)
    return tuple(base + (1 if i < extra else 0) for i in range(k))
