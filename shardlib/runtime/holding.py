"""Calls held to an emulated slow link's time: the bytes are real, the link's time is imposed.

``comm`` wraps every call whose ranks span two "nodes" of an emulated link in a ``Hold``.
"""

from __future__ import annotations

import time
from time import perf_counter

import torch
import torch.distributed as dist


class Hold:
    """One call across an emulated slow link (``emulation.EmulatedLink``), timed as the link would time it.

    Beside the call goes an 8-byte stamp of its start on the ``perf_counter`` clock (one clock for every
    process of a machine, so stamps compare across ranks). A collective's ranks take the latest start
    (an all-reduce MAX of the stamps, issued just before the call, in the same order on every rank) and
    end no sooner than ``latest start + link time``: no rank finishes before the last has arrived and
    the bytes have crossed. A send hands its stamp and bytes on and returns as soon as they have left; the
    receiver ends no sooner than ``the sender's start + link time``, as if the bytes were in flight
    that long. The stamps are not logged.
    """

    def __init__(self, op: str, group, peer: int | None, start_s: float, link_s: float, device) -> None:
        self.link_s, self.waits = link_s, op != "send"
        self.stamp = torch.tensor([start_s], dtype=torch.float64, device=device)
        if op == "send":
            self.work = dist.isend(self.stamp, peer, group=group)
        elif op == "recv":
            self.work = dist.irecv(self.stamp, peer, group=group)
        else:
            self.work = dist.all_reduce(self.stamp, op=dist.ReduceOp.MAX, group=group, async_op=True)

    def until_s(self) -> float | None:
        """When the call may end on this rank (``None``: at once, for a sender)."""
        self.work.wait()
        return self.stamp.item() + self.link_s if self.waits else None


def sleep_until(when_s: float | None) -> float:
    """Sleep until ``when_s`` on the ``perf_counter`` clock (if given and still ahead); return the time after."""
    left = 0.0 if when_s is None else when_s - perf_counter()
    if left > 0:
        time.sleep(left)
    return perf_counter()
