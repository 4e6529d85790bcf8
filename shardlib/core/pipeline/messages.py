"""Messages between pipeline stages, posted ahead: every receive at the start, every send without waiting.

gloo's ``send`` blocks until the receiver takes the message, so two neighbours sending to each other at
once (a forward going right while a backward comes left, as in 1F1B) would wait for each other forever.
Real pipelines post non-blocking sends and receives ahead of time (Megatron-LM's ``batch_isend_irecv``);
here a stage posts one ``irecv`` for every message it will get, in the order each neighbour sends them
(``Schedule.messages``: messages between two ranks meet their receives in order), and an ``isend`` for
every result it hands on. Receiving ahead matters: gloo moves a message only once the receiver has asked
for it, so a receive posted at the last moment costs a round trip. Every message goes through ``comm``
(``ctx.comm``, or a group's), which logs it.
"""

from __future__ import annotations

import torch


class Links:
    """One stage's messages in one step. ``shape_of(action)`` is the shape of the tensor that ``action``
    produces, of ``dtype``; every receive is posted as the links open."""

    def __init__(self, comm, schedule, rank: int, shape_of, device, dtype) -> None:
        self.comm, self.sent = comm, []
        self.received = {a: comm.irecv(torch.empty(shape_of(a), device=device, dtype=dtype), src)
                         for src in range(schedule.n_stages) if src != rank for a in schedule.messages(src, rank)}

    def put(self, dst: int, tensor: torch.Tensor) -> None:
        self.sent.append(self.comm.isend(tensor.detach().contiguous(), dst))

    def take(self, producer) -> torch.Tensor:
        """Wait until the result of ``producer`` (an ``Action`` of another stage) has arrived, and return it."""
        return self.received.pop(producer).wait()

    def close(self) -> None:
        """Wait until every message sent this step has been received."""
        for pending in self.sent:
            pending.wait()
