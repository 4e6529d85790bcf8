"""What a grader hands back: passed or not, and messages a learner can act on.

Every grader in ``shardlib.exercises`` calls the learner's function on several cases, compares each
answer with the library's reference, and collects what differs (which shard, which shard count, which
rank) with a hint naming the likely mistake. It never raises for a wrong answer: the notebook shows
the result, and an unfinished exercise (one whose body still raises ``NotImplementedError``) is
reported as "not written yet".
"""

from __future__ import annotations

import html
from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if self.status not in (PASSED, NOT_WRITTEN, NOT_RIGHT):
            raise ValueError(f"status must be one of {(PASSED, NOT_WRITTEN, NOT_RIGHT)}, got {self.status!r}")
        object.__setattr__(self, "messages", tuple(self.messages))

    @property
    def passed(self) -> bool:
        return self.status == PASSED

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

    def __init__(self, exercise: str, checked: str) -> None:
        self.exercise, self.checked = exercise, checked
        self.messages: list[str] = []
        self.not_written = False

    def fail(self, message: str) -> None:
        self.messages.append(message)

    @property
    def failed(self) -> bool:
        return self.not_written or bool(self.messages)

    def result(self, success: str = "") -> ExerciseResult:
        if self.not_written:
            return ExerciseResult(self.exercise, NOT_WRITTEN,
                                  ("the function still raises NotImplementedError: replace that line with "
                                   "your code, run its cell, then run this one again",), self.checked)
        if self.messages:
            extra = len(self.messages) - MAX_MESSAGES
            shown = self.messages[:MAX_MESSAGES] + ([f"... and {extra} more"] if extra > 0 else [])
            return ExerciseResult(self.exercise, NOT_RIGHT, tuple(shown), self.checked)
        return ExerciseResult(self.exercise, PASSED, (success,) if success else (), self.checked)


def check_callable(fn, what: str) -> None:
    """A clear error when the grader is handed something other than the learner's function."""
    if not callable(fn):
        raise ValueError(f"pass your function itself, e.g. check(my_{what}), not {type(fn).__name__} {fn!r}")


def call(collector: Collector, where: str, fn, *args):
    """``fn(*args)``, or ``None`` after recording why it could not be called (not written, or an error)."""
    try:
        return fn(*args)
    except NotImplementedError:
        collector.not_written = True
        return None
    except Exception as exc:  # the learner's bug, reported in their terms rather than raised
        collector.fail(f"{where}: your function raised {type(exc).__name__}: {exc}")
        return None


def span(start: int, stop: int) -> str:
    """``start..stop`` (stop exclusive, as in a Python slice)."""
    return f"{start}..{stop}"
