"""Messages between pipeline stages: each neighbour gets a sending thread and a receiving thread.

gloo's ``send`` blocks until the receiver takes the message, so two neighbours sending to each other at
once (a forward going right while a backward comes left, as in 1F1B) would wait for each other forever.
Real pipelines post non-blocking sends and receives ahead of time; here each rank sends on one thread per
neighbour (``Outbox``) and receives on one thread per neighbour (``Inbox``), in the order the schedule
says that neighbour sends (``Schedule.messages``). Every message goes through ``ctx.comm``, which logs it.
"""

from __future__ import annotations

import queue
import threading

import torch


class Outbox:
    """Sends tensors to one neighbour, in order, on a thread of its own."""

    def __init__(self, comm, dst: int) -> None:
        self.comm, self.dst = comm, dst
        self.error: BaseException | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"pipeline-send-to-{dst}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (tensor := self._queue.get()) is not None:
            try:
                self.comm.send(tensor, self.dst)
            except BaseException as exc:  # reported by close()
                self.error = exc
                return

    def put(self, tensor: torch.Tensor) -> None:
        if self.error is not None:
            raise RuntimeError(f"sending to rank {self.dst} failed: {self.error!r}")
        self._queue.put(tensor.detach().contiguous())

    def close(self) -> None:
        """Wait until everything queued has been received."""
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise RuntimeError(f"sending to rank {self.dst} failed: {self.error!r}")


class Inbox:
    """Receives one neighbour's messages on a thread of its own, in the order that neighbour sends them,
    and hands them out by the action that produced them. Receiving ahead matters: gloo moves a message
    only once the receiver has asked for it, so a receive posted at the last moment costs a round trip."""

    def __init__(self, comm, src: int, expected, shape_of, device, dtype=None) -> None:
        self.comm, self.src, self.device, self.dtype = comm, src, device, dtype
        self.error: BaseException | None = None
        self._arrived: dict = {}
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, args=(list(expected), shape_of),
                                        name=f"pipeline-recv-from-{src}", daemon=True)
        self._thread.start()

    def _loop(self, expected, shape_of) -> None:
        try:
            for producer in expected:
                tensor = self.comm.recv(torch.empty(shape_of(producer), device=self.device, dtype=self.dtype), self.src)
                with self._cond:
                    self._arrived[producer] = tensor
                    self._cond.notify_all()
        except BaseException as exc:  # reported by take()
            with self._cond:
                self.error = exc
                self._cond.notify_all()

    def take(self, producer) -> torch.Tensor:
        """Wait until the result of ``producer`` has arrived, and return it."""
        with self._cond:
            while producer not in self._arrived:
                if self.error is not None:
                    raise RuntimeError(f"receiving from rank {self.src} failed: {self.error!r}")
                self._cond.wait()
            return self._arrived.pop(producer)


class Links:
    """One stage's messages in one step: an ``Outbox`` for each stage it sends to, an ``Inbox`` for each
    stage it hears from. ``shape_of(action)`` is the shape of the tensor that ``action`` produces;
    ``dtype``, its dtype (``None``: torch's default)."""

    def __init__(self, comm, schedule, rank: int, shape_of, device, dtype=None) -> None:
        others = [s for s in range(schedule.n_stages) if s != rank]
        self.outboxes = {dst: Outbox(comm, dst) for dst in others if schedule.messages(rank, dst)}
        self.inboxes = {src: Inbox(comm, src, schedule.messages(src, rank), shape_of, device, dtype)
                        for src in others if schedule.messages(src, rank)}

    def put(self, dst: int, tensor: torch.Tensor) -> None:
        self.outboxes[dst].put(tensor)

    def take(self, producer) -> torch.Tensor:
        return self.inboxes[producer.stage].take(producer)

    def close(self) -> None:
        """Wait until every message sent this step has been received."""
        for box in self.outboxes.values():
            box.close()
