"""The KV hand-off: one request's K and V from the prefill rank that computed them to the decode rank
that will read them (Patel et al. 2024, Splitwise; Zhong et al. 2024, DistServe).

Each prefill rank holds the K/V of its own KV heads (``paged.PagedModel``) and sends them to the decode rank of
the same tensor-parallel index: ``2 x layers x KV heads per rank x head_dim x bytes x prompt tokens`` per
rank (``predict.serving.presets.kv_bytes_per_rank``), point to point (``ctx.comm.isend`` / ``irecv``),
**whole** after the prompt's last step or **layer by layer** during it (Splitwise's layer-wise transfer).
Two channels join a prefill rank and its peer: control messages on the default group (four float64: a
*header* announcing a request before its last step, so the receives are posted early; from the pool's
leader, the *token*, the first token and when; *end*), and the K/V on a ``handoff`` group, tagged by
request so several requests' layers may interleave. gloo's point-to-point work learns it is complete
only in ``wait()``: the decode side waits its control messages on a thread of its own and reads them
between steps. No timing here.
"""

from __future__ import annotations

import queue
import threading
from collections import deque

import torch

HEADER, TOKEN, END = 0.0, 1.0, -1.0


class Listener:
    """A thread that receives ``length``-value messages of ``dtype`` from ``src`` and hands each to ``take``
    until ``last(values)`` says it was the last. gloo's point-to-point work reports completion only to
    ``wait()``, so a thread waits. A failure goes to ``take`` too (the exception), and ``check`` raises it."""

    def __init__(self, comm, src: int, length: int, dtype, take, last) -> None:
        self.src, self.error = src, None
        self._thread = threading.Thread(target=self._loop, args=(comm, length, dtype, take, last), daemon=True,
                                        name=f"listen-to-{src}")
        self._thread.start()

    def _loop(self, comm, length, dtype, take, last) -> None:
        try:
            while True:
                values = comm.recv(torch.empty(length, dtype=dtype), self.src).tolist()
                take(values)
                if last(values):  # asked after take, which may keep what it decides on
                    return
        except BaseException as exc:  # raised on the rank's own thread by check()
            self.error = exc
            take(exc)

    def check(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"receiving from rank {self.src} failed: {self.error!r}")

    def join(self) -> None:
        self._thread.join()
        self.check()


def _tag(index: int) -> int:
    return int(index) + 1  # tag 0 is the control channel's


class KVSender:
    """A prefill rank's side: control messages to ``peer`` (the decode rank of the same TP index) and each
    request's K/V on ``group``. ``sent`` lists, per K/V message in the order it was waited, its request."""

    def __init__(self, comm, peer: int, group) -> None:
        self.comm, self.peer, self.group = comm, peer, group
        self._flight: deque = deque()  # (request index or None for control, Pending), oldest first
        self.sent: list[int] = []

    def _control(self, kind: float, index: int, a: float = 0.0, b: float = 0.0) -> None:
        msg = torch.tensor([kind, float(index), float(a), float(b)], dtype=torch.float64)
        self._flight.append((None, self.comm.isend(msg, self.peer)))

    def announce(self, index: int, n_tokens: int) -> None:
        """The header: request ``index``'s ``n_tokens`` of K/V will follow."""
        self._control(HEADER, index, n_tokens)

    def token(self, index: int, first_token: int, time_s: float) -> None:
        """From the pool's leader: the request's first token, sampled at ``time_s``."""
        self._control(TOKEN, index, first_token, time_s)

    def end(self) -> None:
        self._control(END, -1)

    def send(self, index: int, cache, table, n_tokens: int, layer: int | None = None) -> None:
        """Request ``index``'s K/V from ``cache``, read through its block ``table``: every layer at once
        (``layer`` None) or one layer."""
        slots = cache.slots(table, torch.arange(n_tokens, device=cache.k.device))
        if layer is None:
            kv = torch.stack([cache.k[:, slots], cache.v[:, slots]], dim=1)  # (layers, 2, tokens, kv heads, hd)
        else:
            kv = torch.stack([cache.k[layer, slots], cache.v[layer, slots]])  # (2, tokens, kv heads, hd)
        self._flight.append((index, self.comm.isend(kv, self.peer, group=self.group, tag=_tag(index))))

    def poll(self) -> None:
        """Wait what has completed, oldest first (so the comm log keeps the order of ``sent``); on gloo
        nothing says so before ``wait()``, and ``finish`` waits it all."""
        while self._flight and self._flight[0][1].is_completed():
            self._done(*self._flight.popleft())

    def finish(self) -> None:
        """Wait every message still in flight."""
        while self._flight:
            self._done(*self._flight.popleft())

    def _done(self, index, pending) -> None:
        pending.wait()
        if index is not None:
            self.sent.append(index)


class KVReceiver:
    """A decode rank's side. A ``Listener`` queues the control messages from ``peer``; ``poll`` reads them. A
    header posts the request's K/V receives at once (one per layer layer by layer, else one) into buffers
    shaped like this rank's ``cache`` (``paged.KVCache``); ``land`` waits them and writes them into it."""

    def __init__(self, comm, peer: int, group, cache, layerwise: bool) -> None:
        self.comm, self.peer, self.group, self.cache, self.layerwise = comm, peer, group, cache, layerwise
        self.incoming: dict[int, tuple[int, list]] = {}  # request index -> (tokens, pending receives)
        self.tokens: deque = deque()  # (request index, first token, time it was sampled), in arrival order
        self.ended = False
        self._arrived: queue.Queue = queue.Queue()
        self._listener = Listener(comm, peer, 4, torch.float64, self._arrived.put, lambda msg: msg[0] == END)

    def poll(self, block: bool = False) -> None:
        """Read the control messages that have arrived (with ``block``, wait for at least one)."""
        while not self.ended:
            try:
                msg = self._arrived.get(block=block)
            except queue.Empty:
                return
            block = False
            if isinstance(msg, BaseException):
                raise RuntimeError(f"the control channel from rank {self.peer} failed") from msg
            kind, index, a, b = msg
            index = int(index)
            if kind == END:
                self.ended = True
                self._listener.join()
            elif kind == HEADER:
                self.incoming[index] = (int(a), self._post_kv(index, int(a)))
            elif kind == TOKEN:
                self.tokens.append((index, int(a), b))
            else:
                raise RuntimeError(f"unknown control message {kind} from rank {self.peer}")

    def _post_kv(self, index: int, n: int) -> list:
        n_layers, _, kv_heads, head_dim = self.cache.k.shape
        shape = (2, n, kv_heads, head_dim) if self.layerwise else (n_layers, 2, n, kv_heads, head_dim)
        return [self.comm.irecv(self.cache.k.new_empty(shape), self.peer, group=self.group, tag=_tag(index))
                for _ in range(n_layers if self.layerwise else 1)]

    def land(self, index: int, table) -> None:
        """Request ``index``'s K/V, once arrived, written into the cache at the slots of its block ``table``."""
        while index not in self.incoming:
            if self.ended:
                raise RuntimeError(f"rank {self.peer} ended without sending the K/V of request {index}")
            self.poll(block=True)
        n, pending = self.incoming.pop(index)
        k, v = self.cache.k, self.cache.v  # (layers, slots, kv heads, hd)
        slots = self.cache.slots(table, torch.arange(n, device=k.device))
        if self.layerwise:
            for layer, p in enumerate(pending):
                kv = p.wait()  # (2, tokens, kv heads, hd)
                k[layer, slots], v[layer, slots] = kv[0], kv[1]
        else:
            kv = pending[0].wait()  # (layers, 2, tokens, kv heads, hd)
            k[:, slots], v[:, slots] = kv[:, 0], kv[:, 1]

    def wait_end(self) -> None:
        while not self.ended:
            self.poll(block=True)
        if self.incoming:
            raise RuntimeError(f"K/V of requests {sorted(self.incoming)} arrived but were never admitted")
