"""What a grader hands back, and the checks every grader shares.

A grader calls the learner's function on several cases, compares each answer with the library's own
result, and collects what differs with a hint naming the likely mistake. It never raises for a wrong
answer: the notebook shows the result. An unfinished exercise (its body still raises
``NotImplementedError``) is "not written yet". Shared here: calling the learner's function safely
(``call``), tensors compared within a tolerance (``close``), the first likely mistake that reproduces an
answer (``first_match``), a bad input that must raise ``ValueError`` (``must_refuse``), and a rank
function run on real ranks (``written`` first, alone; then ``run_on``, or ``runs`` over several pools).

A grader declares the properties it checks, in order, with what each is worth in an assignment
(``@checks(values=2, bytes=1)``); each message it records names the property that failed, so an nbgrader test
cell can award one property (``result.holds("values")``) while another fails.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import torch

from shardlib.lab.harness import on_ranks
from shardlib.runtime.errors import RankError, RankTimeoutError
from shardlib.ui.theme import MUTED_COLOUR, RIGHT_COLOUR, WRONG_COLOUR

PASSED, NOT_WRITTEN, NOT_RIGHT = "passed", "not written yet", "not yet right"
MAX_MESSAGES = 4  # the first few differences say enough; the rest usually repeat them


@dataclass(frozen=True)
class ExerciseResult:
    """The outcome of one grader: ``status`` is ``"passed"``, ``"not written yet"`` or ``"not yet right"``."""

    exercise: str
    status: str
    messages: tuple[str, ...]
    checked: str  # what the grader tried, e.g. "n_shards = 2, 3, 4, 8"
    checks: tuple[str, ...] = ("answer",)  # the properties the grader checks, in the order it checks them
    failed_checks: tuple[str, ...] = ()  # those that failed

    def __post_init__(self) -> None:
        if self.status not in (PASSED, NOT_WRITTEN, NOT_RIGHT):
            raise ValueError(f"status must be one of {(PASSED, NOT_WRITTEN, NOT_RIGHT)}, got {self.status!r}")
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "failed_checks", tuple(c for c in self.checks if c in self.failed_checks))

    @property
    def passed(self) -> bool:
        return self.status == PASSED

    def holds(self, check: str) -> bool:
        """The function is written and ``check`` held, with every property checked before it (a grader tests a
        later property only once the earlier ones hold: the bytes of a wrong answer are not worth counting)."""
        if check not in self.checks:
            raise ValueError(f"{self.exercise} checks {list(self.checks)}, not {check!r}")
        earlier = self.checks[:self.checks.index(check) + 1]
        return self.status != NOT_WRITTEN and not set(earlier) & set(self.failed_checks)

    def __str__(self) -> str:
        head = f"{self.exercise}: {self.status} (checked {self.checked})"
        return "\n".join([head] + [f"  - {m}" for m in self.messages])

    def _repr_pretty_(self, printer, cycle) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colour = {PASSED: RIGHT_COLOUR, NOT_WRITTEN: MUTED_COLOUR, NOT_RIGHT: WRONG_COLOUR}[self.status]
        items = "".join(f"<li>{html.escape(m)}</li>" for m in self.messages)
        return (f'<div><b>{html.escape(self.exercise)}</b>: <span style="color:{colour}"><b>'
                f"{html.escape(self.status)}</b></span> <small>(checked {html.escape(self.checked)})</small>"
                f"{'<ul>' + items + '</ul>' if items else ''}</div>")


class Collector:
    """Gathers the messages of one grading run and turns them into an ``ExerciseResult``."""

    def __init__(self, exercise: str, checked: str, checks=("answer",)) -> None:
        self.exercise, self.checked, self.checks = exercise, checked, tuple(checks)
        self.messages: list[str] = []
        self.failed_checks: set[str] = set()
        self.not_written = False

    def fail(self, message: str, check: str | None = None) -> None:
        """Record what differs; ``check`` names the property it breaks (the grader's first by default)."""
        if check is not None and check not in self.checks:
            raise ValueError(f"{self.exercise} checks {list(self.checks)}, not {check!r}")
        self.messages.append(message)
        self.failed_checks.add(check or self.checks[0])

    @property
    def failed(self) -> bool:
        return self.not_written or bool(self.messages)

    def result(self, success: str = "") -> ExerciseResult:
        if self.not_written:
            return ExerciseResult(self.exercise, NOT_WRITTEN,
                                  ("the function still raises NotImplementedError: replace that line with "
                                   "your code, run its cell, then run this one again",), self.checked, self.checks)
        if self.messages:
            extra = len(self.messages) - MAX_MESSAGES
            shown = self.messages[:MAX_MESSAGES] + ([f"... and {extra} more"] if extra > 0 else [])
            return ExerciseResult(self.exercise, NOT_RIGHT, tuple(shown), self.checked, self.checks,
                                  tuple(self.failed_checks))
        return ExerciseResult(self.exercise, PASSED, (success,) if success else (), self.checked, self.checks)


def checks(**points: int):
    """Declare a grader's properties, in the order it checks them, and the points each is worth in an
    assignment: ``@checks(values=2, bytes=1)`` sets ``grader.checks``, which its ``Collector`` takes."""
    if not points or any(not isinstance(p, int) or p < 1 for p in points.values()):
        raise ValueError(f"each property needs a whole number of points, at least 1, got {points}")

    def mark(grader):
        grader.checks = dict(points)
        return grader
    return mark


def check_callable(fn, what: str) -> None:
    """A clear error when the grader is handed something other than the learner's function."""
    if not callable(fn):
        raise ValueError(f"pass your function itself, e.g. check(my_{what}), not {type(fn).__name__} {fn!r}")


def call(collector: Collector, where: str, fn, *args, hint: str = "", answers: bool = True, check: str | None = None):
    """``fn(*args)``, or ``None`` after recording why there is no answer (not written, an error followed by
    ``hint``, or, where the function ``answers``, ``None`` returned) against the property ``check``."""
    try:
        value = fn(*args)
    except NotImplementedError:
        collector.not_written = True
        return None
    except Exception as exc:  # the learner's bug, reported in their terms rather than raised
        collector.fail(f"{where}: your function raised {type(exc).__name__}: {exc}{hint}", check)
        return None
    if value is None and answers:
        collector.fail(f"{where}: your function returned None: end it with `return` and its answer", check)
    return value


def span(start: int, stop: int) -> str:
    """``start..stop`` (stop exclusive, as in a Python slice)."""
    return f"{start}..{stop}"


def close(a, b: torch.Tensor, atol: float = 1e-5, rtol: float = 0.0) -> bool:
    """``a`` is a tensor of ``b``'s shape, equal to it within ``atol`` (and ``rtol``)."""
    return (isinstance(a, torch.Tensor) and a.shape == b.shape
            and torch.allclose(a.to(b.dtype), b, rtol=rtol, atol=atol))


def first_match(value, mistakes, same=close) -> str | None:
    """The hint of the first ``(what that mistake gives, hint)`` pair whose value ``same(value, ...)``
    accepts; ``None`` when no likely mistake reproduces the learner's value."""
    return next((hint for wrong, hint in mistakes if same(value, wrong)), None)


def must_refuse(collector: Collector, where: str, fn, args: tuple, why: str, shown=repr,
                check: str | None = None) -> None:
    """``fn(*args)`` must raise ``ValueError``: ``why`` says why the input is bad, in the learner's terms;
    ``shown`` describes what was returned instead; a failure breaks the property ``check``."""
    try:
        value = fn(*args)
    except ValueError:
        return
    except NotImplementedError:
        collector.not_written = True
    except Exception as exc:  # the learner's bug, reported rather than raised
        collector.fail(f"{where}: raise ValueError ({why}), not {type(exc).__name__}: {exc}", check)
    else:
        collector.fail(f"{where}: {why}, so it should raise ValueError saying so; it returned {shown(value)}", check)


class Alone:
    """A one-rank stand-in for ``ctx``: every collective hands its input back."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.comm = self

    def __getattr__(self, name):
        return lambda tensor, *args, **kwargs: tensor


def written(collector: Collector, rank_fn, *args) -> bool:
    """False, recorded as not written, if ``rank_fn(Alone(), *args)`` raises ``NotImplementedError`` at once,
    so that a blank starter never reaches the ranks (a failed call restarts the pool, which costs seconds)."""
    try:
        rank_fn(Alone(), *args)
    except NotImplementedError:
        collector.not_written = True
        return False
    except Exception:  # noqa: BLE001 - any other error is the real run's to report
        return True
    return True


def need_pools(pools, grader: str) -> str:
    """``"on 2 ranks and 4 ranks"`` for the pools given; a clear error when there are none."""
    if not pools:
        raise ValueError(f"{grader} needs at least one Ranks pool, e.g. {grader}(fn, ranks)")
    return "on " + " and ".join(f"{p.world_size} ranks" for p in pools)


def run_on(collector: Collector, pool, rank_fn, *args, shapes_hint: str = "", check: str | None = None):
    """``on_ranks(pool, rank_fn, *args)``, or ``None`` after recording why it failed (against the property
    ``check``): ranks that hang, a rank that raised (``shapes_hint`` added when it was a shape mismatch), or
    the body not written."""
    n = pool.world_size
    try:
        return on_ranks(pool, rank_fn, *args)
    except RankTimeoutError as err:
        collector.fail(f"{n} ranks: ranks {err.ranks_silent} never finished: every rank must call the same "
                       "collectives in the same order (a collective inside `if ctx.rank == ...` hangs the others)",
                       check)
    except RankError as err:
        if "NotImplementedError" in err.remote_traceback:
            collector.not_written = True
            return None
        shapes = any(s in err.remote_traceback for s in ("cannot be multiplied", "size of tensor"))
        collector.fail(f"{n} ranks: rank {err.rank} raised {str(err).splitlines()[0]}"
                       + (shapes_hint if shapes else ""), check)
    return None


def runs(collector: Collector, pools, rank_fn, inputs, shapes_hint: str = "", check: str | None = None):
    """Per pool, ``(pool, args, measured)`` with ``args = inputs(pool)`` and ``measured`` from ``run_on``;
    a pool whose run failed is skipped (its failure recorded), and it stops once the body is not written."""
    for pool in pools:
        args = inputs(pool)
        measured = run_on(collector, pool, rank_fn, *args, shapes_hint=shapes_hint, check=check)
        if collector.not_written:
            return
        if measured is not None:
            yield pool, args, measured
