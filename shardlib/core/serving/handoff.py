"""The KV hand-off: one request's K and V from the prefill ranks that computed them to the decode ranks
that will read them (Patel et al. 2024, Splitwise; Zhong et al. 2024, DistServe).

Each pool splits the KV heads over its own ranks (``paged.PagedModel``), and the pools may differ in size
(DistServe picks each phase's parallelism apart). ``head_overlaps`` pairs them as vLLM's and SGLang's KV
connectors do when the two sides' TP differ: prefill rank ``i`` of ``P`` holds heads ``[i H/P, (i+1) H/P)``,
decode rank ``j`` of ``D`` needs ``[j H/D, (j+1) H/D)``, and each pair whose ranges overlap exchanges just
the overlap (``P > D``: a decode rank gathers; ``P < D``: a prefill rank sends a slice to each; ``P = D``:
rank to peer). A link carries ``2 x layers x shared KV heads x head_dim x bytes x prompt tokens``
(``presets.kv_bytes_per_link``), point to point, **whole** after the prompt's last step or **layer by
layer** during it (Splitwise). Control messages go on the default group (four float64: a *header* before
the last step, so the receives are posted early; from prefill leader to decode leader only, the *token*;
*end*), the K/V on a ``handoff`` group, tagged by request. gloo's point-to-point work learns it is complete
only in ``wait()``: a decode rank waits each of its prefill ranks' control messages on a thread and reads
them between steps. No timing here.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from dataclasses import dataclass

import torch

HEADER, TOKEN, END = 0.0, 1.0, -1.0


def kv_heads_held(index: int, tp: int, n_kv_heads: int) -> range:
    """The KV heads rank ``index`` of a ``tp``-way split holds (``tensor_parallel.blocks``): ``n_kv_heads / tp``
    in a row, or, once ``tp`` passes the heads, one head copied on ``tp / n_kv_heads`` ranks in a row."""
    if tp <= n_kv_heads:
        per = n_kv_heads // tp
        return range(index * per, (index + 1) * per)
    head = index * n_kv_heads // tp
    return range(head, head + 1)


@dataclass(frozen=True)
class HeadOverlap:
    """One link of the hand-off: prefill rank ``prefill`` sends decode rank ``decode`` (each its index in its
    own pool) the K/V of the KV ``heads`` (numbered in the whole model) they both hold."""

    prefill: int
    decode: int
    heads: range


def head_overlaps(n_kv_heads: int, prefill_tp: int, decode_tp: int) -> tuple[HeadOverlap, ...]:
    """Every link between a ``prefill_tp``-way and a ``decode_tp``-way split of ``n_kv_heads`` KV heads: each
    decode rank gets each head it holds from exactly one prefill rank holding it; where the prefill pool
    holds ``c`` copies of a head, from the copy whose index matches the decode rank's modulo ``c``. Equal
    pools give the pairs ``(i, i)``, each with all of rank ``i``'s heads."""
    for tp in (prefill_tp, decode_tp):
        if tp < 1 or (n_kv_heads % tp and tp % n_kv_heads):
            raise ValueError(f"{n_kv_heads} KV heads cannot be split {tp} ways: a pool's size must divide them "
                             "or be a multiple of them")
    copies = max(1, prefill_tp // n_kv_heads)
    links = []
    for i in range(prefill_tp):
        held = kv_heads_held(i, prefill_tp, n_kv_heads)
        for j in range(decode_tp):
            need = kv_heads_held(j, decode_tp, n_kv_heads)
            shared = range(max(held.start, need.start), min(held.stop, need.stop))
            if shared and i % copies == j % copies:
                links.append(HeadOverlap(i, j, shared))
    return tuple(links)


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
    """A prefill rank's side: control messages and each request's K/V (on ``group``) over its ``links``,
    ``(decode rank in the job, the shared heads as a slice of this rank's own)`` per link. ``sent`` lists,
    per K/V message in the order it was waited, ``(request index, decode rank)``."""

    def __init__(self, comm, links, group) -> None:
        self.comm, self.links, self.group = comm, tuple(links), group
        self.peers = tuple(peer for peer, _ in self.links)
        self._flight: deque = deque()  # (what it carried: None for control, Pending), oldest first
        self.sent: list[tuple[int, int]] = []

    def _control(self, peers, kind: float, index: int, a: float = 0.0, b: float = 0.0) -> None:
        msg = torch.tensor([kind, float(index), float(a), float(b)], dtype=torch.float64)
        self._flight.extend((None, self.comm.isend(msg, peer)) for peer in peers)

    def announce(self, index: int, n_tokens: int) -> None:
        """The header, to every decode rank this rank sends to: request ``index``'s ``n_tokens`` of K/V follow."""
        self._control(self.peers, HEADER, index, n_tokens)

    def token(self, leader: int, index: int, first_token: int, time_s: float) -> None:
        """From the prefill leader to the decode ``leader`` (linked: both hold head 0): the request's first
        token, sampled at ``time_s``."""
        self._control([leader], TOKEN, index, first_token, time_s)

    def end(self) -> None:
        self._control(self.peers, END, -1)

    def send(self, index: int, cache, table, n_tokens: int, layer: int | None = None) -> None:
        """Request ``index``'s K/V from ``cache``, read through its block ``table``, each link's heads to its
        decode rank: every layer at once (``layer`` None) or one layer."""
        slots = cache.slots(table, torch.arange(n_tokens, device=cache.k.device))
        for peer, heads in self.links:
            if layer is None:  # (layers, 2, tokens, shared heads, hd)
                kv = torch.stack([cache.k[:, slots, heads], cache.v[:, slots, heads]], dim=1)
            else:  # (2, tokens, shared heads, hd)
                kv = torch.stack([cache.k[layer, slots, heads], cache.v[layer, slots, heads]])
            self._flight.append(((index, peer), self.comm.isend(kv, peer, group=self.group, tag=_tag(index))))

    def poll(self) -> None:
        """Wait what has completed, oldest first (so the comm log keeps the order of ``sent``); on gloo
        nothing says so before ``wait()``, and ``finish`` waits it all."""
        while self._flight and self._flight[0][1].is_completed():
            self._done(*self._flight.popleft())

    def finish(self) -> None:
        """Wait every message still in flight."""
        while self._flight:
            self._done(*self._flight.popleft())

    def _done(self, carried, pending) -> None:
        pending.wait()
        if carried is not None:
            self.sent.append(carried)


class KVReceiver:
    """A decode rank's side, over its ``links``: ``(prefill rank in the job, the shared heads as a slice of
    this rank's own)`` per link. One ``Listener`` per prefill rank queues its control messages; ``poll`` reads
    them. A header posts that link's K/V receives for the request at once (one per layer layer by layer,
    else one) into buffers of its heads' shape; ``land`` waits every link's and writes them into ``cache``
    (``paged.KVCache``)."""

    def __init__(self, comm, links, group, cache, layerwise: bool) -> None:
        self.comm, self.links, self.group, self.cache, self.layerwise = comm, dict(links), group, cache, layerwise
        self.incoming: dict[int, dict] = {}  # request index -> prefill rank -> (tokens, pending receives)
        self.tokens: deque = deque()  # (request index, first token, time it was sampled), in arrival order
        self._arrived: queue.Queue = queue.Queue()  # (prefill rank, message or the exception its listener met)
        self._listeners = {src: Listener(comm, src, 4, torch.float64, self._take(src), lambda msg: msg[0] == END)
                           for src in self.links}
        self._open = set(self.links)  # the prefill ranks that have not yet sent their end

    def _take(self, src: int):
        return lambda msg: self._arrived.put((src, msg))

    ended = property(lambda self: not self._open)

    def poll(self, block: bool = False) -> None:
        """Read the control messages that have arrived (with ``block``, wait for at least one)."""
        while self._open:
            try:
                src, msg = self._arrived.get(block=block)
            except queue.Empty:
                return
            block = False
            if isinstance(msg, BaseException):
                raise RuntimeError(f"the control channel from rank {src} failed") from msg
            kind, index, a, b = msg
            index = int(index)
            if kind == END:
                self._open.discard(src)
                self._listeners[src].join()
            elif kind == HEADER:
                self.incoming.setdefault(index, {})[src] = (int(a), self._post_kv(src, index, int(a)))
            elif kind == TOKEN:
                self.tokens.append((index, int(a), b))
            else:
                raise RuntimeError(f"unknown control message {kind} from rank {src}")

    def _post_kv(self, src: int, index: int, n: int) -> list:
        n_layers, _, _, head_dim = self.cache.k.shape
        heads = self.links[src]
        shape = (2, n, heads.stop - heads.start, head_dim)  # (2, tokens, shared heads, hd), a layer
        if not self.layerwise:
            shape = (n_layers, *shape)  # (layers, 2, tokens, shared heads, hd)
        return [self.comm.irecv(self.cache.k.new_empty(shape), src, group=self.group, tag=_tag(index))
                for _ in range(n_layers if self.layerwise else 1)]

    def land(self, index: int, table) -> None:
        """Request ``index``'s K/V, once every link's has arrived, written into the cache at the slots of its
        block ``table``, each link's heads in their place."""
        while missing := [s for s in self.links if s not in self.incoming.get(index, {})]:
            if ended := [s for s in missing if s not in self._open]:
                raise RuntimeError(f"rank {ended[0]} ended without sending the K/V of request {index}")
            self.poll(block=True)
        k, v = self.cache.k, self.cache.v  # (layers, slots, kv heads, hd)
        for src, (n, pending) in self.incoming.pop(index).items():
            heads = self.links[src]
            slots = self.cache.slots(table, torch.arange(n, device=k.device))
            if self.layerwise:
                for layer, p in enumerate(pending):
                    kv = p.wait()  # (2, tokens, shared heads, hd)
                    k[layer, slots, heads], v[layer, slots, heads] = kv[0], kv[1]
            else:
                kv = pending[0].wait()  # (layers, 2, tokens, shared heads, hd)
                k[:, slots, heads], v[:, slots, heads] = kv[:, 0], kv[:, 1]

    def wait_end(self) -> None:
        while self._open:
            self.poll(block=True)
        if self.incoming:
            raise RuntimeError(f"K/V of requests {sorted(self.incoming)} arrived but were never admitted")
