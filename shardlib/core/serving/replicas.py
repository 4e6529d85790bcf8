"""``replicas_on_rank``: replicas of the engine behind a router co-hosted on rank 0, on real ranks.

The world is cut into ``replicas`` replicas of ``tp = world / replicas`` ranks (replica ``k``: ranks
``k tp .. k tp + tp - 1``, the first its leader); each runs the engine (``engine.ranks``,
``serving_engine_on_rank`` on its group, tensor-parallel inside). Rank 0 leads replica 0 and hosts the
router: between its own steps, and while idle, it routes every request that has arrived
(``router.Router``), its own into its scheduler, the others packed into an int64 tensor and ``isend`` to
their replica's leader. Each leader, after every step, sends rank 0 a small load report (sequence number,
KV blocks used, requests finished). The router decides from the last reports plus what it
routed since (queued = routed there minus finished there). Each receiver is a thread (``handoff.Listener``),
and the engine's loop polls its queue (``run_engine``'s ``poll``). What this costs: a request that arrives
during rank 0's step waits for the step's end, and the reports are a step old. Real routers
(SGLang's, vLLM's production stack) are a separate process in front of the engines, counting the
requests in flight themselves. An end message, carrying how many requests were sent, closes each
leader's inbox; a final report closes rank 0's.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, replace

import torch

from shardlib.core.serving.engine import EngineRankResult, serving_engine_on_rank
from shardlib.core.serving.handoff import Listener
from shardlib.core.serving.requests import Request
from shardlib.core.serving.router import ReplicaLoad, make_router

END = -1  # a route message whose first value is END closes the inbox; its second: how many were sent
REPORT_VALUES = 4  # sequence number, final, KV blocks used, requests finished
IDLE_WAIT_S = 0.05  # an idle leader blocks this long on its inbox before it looks again


def pack_request(index: int, r: Request, length: int) -> torch.Tensor:
    """A request as ``length`` int64 values: its place in the trace, new tokens, seed + 1 (0: greedy),
    arrival (ns), prompt length, the prompt, padding."""
    flat = [index, r.max_new_tokens, 0 if r.seed is None else r.seed + 1, round(r.arrival_s * 1e9),
            len(r.prompt_token_ids), *r.prompt_token_ids]
    return torch.tensor(flat + [0] * (length - len(flat)), dtype=torch.int64)


def unpack_request(values: list[int]) -> Request:
    index, new, seed, arrival_ns, n = values[:5]
    return Request(index, values[5:5 + n], new, arrival_s=arrival_ns / 1e9, seed=None if seed == 0 else seed - 1)


@dataclass(frozen=True)
class RouterRankResult(EngineRankResult):
    """Rank 0's result: its engine's (a leader's outputs are keyed by the request's place in the trace),
    and the router's record: each request's replica, and the most requests it saw queued at each replica."""

    replica_of: tuple[int, ...] = ()
    max_queued: tuple[int, ...] = ()


class _RouterHost:
    """Rank 0's router: routes what has arrived, reads the leaders' reports."""

    def __init__(self, ctx, router, requests, replicas: int, tp: int, config, length: int) -> None:
        self.ctx, self.router, self.requests, self.tp, self.length = ctx, router, requests, tp, length
        self.replicas, self.blocks_total = replicas, config.num_blocks
        self.order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
        self.next = 0
        self.routed_to, self.max_queued = [0] * replicas, [0] * replicas
        self.replica_of = [0] * len(requests)
        self.finished, self.kv_used = [0] * replicas, [0] * replicas  # the leaders' last reports
        self.counts = [0] * replicas  # reports received per leader
        self.sends, self.ended = [], False
        self._lock = threading.Lock()
        self.inboxes = [Listener(ctx.comm, k * tp, REPORT_VALUES, torch.int64, self._take(k), self._last(k))
                        for k in range(1, replicas)]

    def _take(self, k):
        def take(values):
            if not isinstance(values, BaseException):  # a failure: check() raises it
                with self._lock:
                    self.counts[k] += 1
                    self.kv_used[k], self.finished[k] = values[2], values[3]
        return take

    def _last(self, k):
        return lambda values: values[1] == 1 and self.counts[k] == values[0]

    def loads(self, sched) -> list[ReplicaLoad]:
        with self._lock:
            finished, kv = list(self.finished), list(self.kv_used)
        finished[0], kv[0] = len(sched.finished), sched.blocks.stats().used  # its own, now
        return [ReplicaLoad(k, self.routed_to[k] - finished[k], min(kv[k], self.blocks_total), self.blocks_total)
                for k in range(self.replicas)]

    def poll(self, sched, now_s: float) -> bool:
        for box in self.inboxes:
            box.check()
        while self.next < len(self.order) and self.requests[self.order[self.next]].arrival_s <= now_s:
            i = self.order[self.next]
            r = self.requests[i]
            loads = self.loads(sched)
            k = self.router.choose(r, loads)
            self.router.routed(r, k)
            self.routed_to[k] += 1
            self.max_queued[k] = max(self.max_queued[k], loads[k].queued + 1)
            self.replica_of[i] = k
            if k == 0:
                sched.add(replace(r, request_id=i))
            else:
                self.sends.append(self.ctx.comm.isend(pack_request(i, r, self.length), k * self.tp))
            self.next += 1
        if self.next == len(self.order) and not self.ended:
            for k in range(1, self.replicas):
                end = torch.tensor([END, self.routed_to[k]] + [0] * (self.length - 2), dtype=torch.int64)
                self.sends.append(self.ctx.comm.isend(end, k * self.tp))
            self.ended = True
        if self.next < len(self.order) and sched.idle:  # nothing to serve: sleep until the next arrival
            self.ctx.wait_s(min(self.requests[self.order[self.next]].arrival_s - now_s, IDLE_WAIT_S))
        return self.next < len(self.order)

    def close(self) -> None:
        for pending in self.sends:
            pending.wait()
        for box in self.inboxes:
            box.join()


class _ReplicaLeader:
    """A replica's leader (not rank 0): takes routed requests from its inbox, reports after each step."""

    def __init__(self, ctx, length: int) -> None:
        self.ctx, self.arrived, self.received, self.expected = ctx, queue.Queue(), 0, None
        self.reports, self.sent, self.done = [], 0, False
        self.inbox = Listener(ctx.comm, 0, length, torch.int64, self._take, self._last)

    def _take(self, values) -> None:
        if isinstance(values, BaseException):  # poll() raises it
            self.arrived.put(None)
        elif values[0] == END:
            self.expected = values[1]
        else:
            self.received += 1
            self.arrived.put(unpack_request(values))
        if not isinstance(values, BaseException) and self._last(values):
            self.arrived.put(None)  # the inbox is closed

    def _last(self, values) -> bool:
        return self.expected is not None and self.received == self.expected

    def poll(self, sched, now_s: float) -> bool:
        block = sched.idle
        while not self.done:
            try:
                item = self.arrived.get(block=block, timeout=IDLE_WAIT_S if block else None)
            except queue.Empty:
                break
            block = False
            if item is None:
                self.inbox.check()
                self.done = True
            else:
                sched.add(item)
        return not self.done

    def _send(self, *values: int) -> None:  # a numbered report to rank 0 (``REPORT_VALUES``)
        self.sent += 1
        self.reports.append(self.ctx.comm.isend(torch.tensor([self.sent, *values], dtype=torch.int64), 0))

    def report(self, sched) -> None:
        self._send(0, sched.blocks.stats().used, len(sched.finished))

    def close(self, result: EngineRankResult) -> None:
        self._send(1, 0, len(result.outputs))  # the final report: rank 0's inbox closes
        for pending in self.reports:
            pending.wait()
        self.inbox.join()


def replicas_on_rank(ctx, weights, requests, config, replicas: int, policy: str, router_options: dict,
                     max_prompt_tokens: int) -> EngineRankResult:
    """Serve ``requests`` on ``replicas`` replicas routed by ``policy``. Every rank is handed the trace
    (a pool ships the same arguments to all), but only rank 0 reads it: a leader learns each of its
    requests from the message rank 0 sends it."""
    tp, length = ctx.world_size // replicas, 5 + max_prompt_tokens
    replica = ctx.rank // tp
    ranks = list(range(replica * tp, replica * tp + tp))
    if tp > 1:
        mesh = ctx.device_mesh((replicas, tp), ("replica", "tp"))
        group = ctx.group(ranks, mesh.get_group("tp"))
    else:
        group = ctx.group(ranks, None)  # one rank: no collective is ever called on it
    ctx.comm.barrier()
    start_s = float(ctx.comm.broadcast(torch.tensor([ctx.now_s()], dtype=torch.float64), src=0))
    if group.rank != 0:
        return serving_engine_on_rank(ctx, weights, [], config, group=group)
    if ctx.rank == 0:
        router = make_router(policy, replicas, config.block_size, **router_options)
        host = _RouterHost(ctx, router, list(requests), replicas, tp, config, length)
        result = serving_engine_on_rank(ctx, weights, [], config, group=group, poll=host.poll, start_s=start_s)
        host.close()
        return RouterRankResult(**vars(result), replica_of=tuple(host.replica_of), max_queued=tuple(host.max_queued))
    leader = _ReplicaLeader(ctx, length)
    result = serving_engine_on_rank(ctx, weights, [], config, group=group, poll=leader.poll, start_s=start_s,
                                    on_step=lambda plan, a, b, sched: leader.report(sched))
    leader.close(result)
    return result
