"""What a pool raises, in the learner's words: a rank that failed, a call that timed out, a closed pool, and
a call that cannot travel to the ranks (``pack_call`` names the piece that cannot be pickled)."""

from __future__ import annotations

import pickle

import cloudpickle


class RankError(RuntimeError):
    """A rank function failed on rank ``rank``; the message holds that rank's traceback."""

    def __init__(self, message: str, rank: int | None = None, remote_traceback: str = "") -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


class PoolClosedError(RuntimeError):
    """``run`` on a pool that was closed: start a new one with ``Ranks(...)``."""


class RankTimeoutError(RankError):
    """A call did not finish in time; ``ranks_silent`` lists the ranks that never answered."""

    def __init__(self, message: str, rank: int | None, ranks_silent: list[int]) -> None:
        super().__init__(message, rank)
        self.ranks_silent = ranks_silent


def pack_call(fn, args: tuple, kwargs: dict) -> bytes:
    """Serialise the call once for every rank, naming the piece that cannot travel if one cannot."""
    try:
        return cloudpickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        pieces = [("the function", fn)] + [(f"argument {i}", a) for i, a in enumerate(args)]
        pieces += [(f"argument {k}=", v) for k, v in kwargs.items()]
        for label, value in pieces:
            try:
                cloudpickle.dumps(value)
            except Exception as inner:
                raise TypeError(
                    f"{label} ({type(value).__name__}) cannot be sent to the ranks: {inner}. Each rank is a "
                    "separate process, so what you pass must be picklable (tensors, numbers, lists, functions "
                    "are; open files, locks, sockets and generators are not)"
                ) from None
        raise TypeError(f"the call cannot be sent to the ranks: {exc}") from None
