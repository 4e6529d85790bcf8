"""Replicas behind a router predicted: the routing replayed, each replica's engine on the fitted step cost.

``route_trace`` replays a trace through a ``Router`` on a simple finish model (a request holds its replica
until it finishes). ``simulate_replicas`` routes the trace with the very ``Router`` a run uses, then
replays each replica's share on its own clock with the engine's scheduler (``engine.
simulate_serving``, one ``StepCost`` for every replica). The router's loads depend on when requests
finish, and that on the routing: the replay starts from "nothing finishes" and routes again with each
request's predicted finish until the routes stop changing (a few rounds). The real router sees reports
a step old; the replay sees its own predicted finishes at once. Returns per request its token times, so
TTFT p50/p90 and throughput come from ``engine.figures``, and the prefix hit rate of each
replica's cache. Pure: torch for the replay's stand-in logits, no ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.serving.requests import Request
from shardlib.core.serving.router import ReplicaLoad, Router, make_router
from shardlib.predict.serving.engine import PredictedServing, StepCost, figures, simulate_serving


def route_trace(router: Router, requests, n_replicas: int, finish: Callable[[Request], float] | None = None,
                kv_blocks_total: int = 64) -> list[int]:
    """Each request's replica, in the order given, when ``router`` routes ``requests`` in arrival order
    (ties by position). The loads it sees: a request holds its replica from its arrival until
    ``finish(request)`` seconds later (``None``: until the trace ends), counting one in ``queued`` and the
    blocks of its prompt and outputs in ``kv_blocks_used`` (no sharing counted; at most
    ``kv_blocks_total``). The router is used as given: pass a fresh one."""
    requests = list(requests)
    if not all(isinstance(r, Request) for r in requests):
        raise ValueError("route_trace takes Requests (core.serving.requests.Request)")
    whole_number(n_replicas, "n_replicas")
    whole_number(kv_blocks_total, "kv_blocks_total (KV blocks per replica)")
    if router.replicas != n_replicas:
        raise ValueError(f"the router routes over {router.replicas} replicas, the trace asks for {n_replicas}")
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_s, i))
    holding: list[list[tuple[float, int]]] = [[] for _ in range(n_replicas)]  # per replica: (until_s, blocks)
    out = [0] * len(requests)
    for i in order:
        r = requests[i]
        for h in holding:
            h[:] = [(until, b) for until, b in h if until > r.arrival_s]
        loads = [ReplicaLoad(k, len(h), min(kv_blocks_total, sum(b for _, b in h)), kv_blocks_total)
                 for k, h in enumerate(holding)]
        k = router.choose(r, loads)
        router.routed(r, k)
        until = math.inf if finish is None else r.arrival_s + number_at_least(finish(r), "finish(request) (seconds)")
        holding[k].append((until, -(-r.total_tokens // router.block_size)))
        out[i] = k
    return out


@dataclass(frozen=True)
class PredictedReplicas:
    """The replay of one policy: ``replica_of[request_id]``, each replica's ``PredictedServing``, every
    request's predicted token times, and the rounds the routing took to settle."""

    policy: str
    replica_of: dict
    per_replica: tuple
    token_times_s: dict
    rounds: int

    @property
    def routed(self) -> tuple[int, ...]:
        return tuple(sum(1 for k in self.replica_of.values() if k == r) for r in range(len(self.per_replica)))

    def hit_rate(self, requests) -> float:
        """Prompt tokens found in a replica's prefix cache over all prompt tokens (each replica's replayed
        hit rate, weighted by the prompt tokens routed there)."""
        tokens = [0] * len(self.per_replica)
        for r in requests:
            tokens[self.replica_of[r.request_id]] += len(r.prompt_token_ids)
        return sum(t * p.prefix_hit_rate for t, p in zip(tokens, self.per_replica)) / sum(tokens)

    def figures(self, requests) -> dict[str, float]:
        """TTFT and TPOT at p50 and p90, end to end at p50, tokens per second, and ``hit_rate``."""
        return {**figures(requests, self.token_times_s), "hit_rate": self.hit_rate(requests)}


def simulate_replicas(requests, engine_config, cost: StepCost, replicas: int, policy: str, max_rounds: int = 6,
                      **router_options) -> PredictedReplicas:
    """``requests`` on ``replicas`` engines of ``engine_config``, each step costing ``cost.step_s``, routed
    by ``policy`` (``router_options`` as for ``make_router``)."""
    given = list(requests)
    whole_number(max_rounds, "max_rounds (routing replays)")
    # ids by place in the trace, zero-padded: each replica's scheduler then takes requests that arrive
    # together in trace order, as a replica on the ranks does (the replay sorts equal arrivals by id)
    requests = [replace(r, request_id=f"{i:08d}") for i, r in enumerate(given)]
    finish_s, routes, rounds = None, None, 0
    while rounds < max_rounds:
        rounds += 1
        router = make_router(policy, replicas, engine_config.block_size, **router_options)
        done = None if finish_s is None else (lambda r, f=finish_s: max(0.0, f[r.request_id] - r.arrival_s))
        new = route_trace(router, requests, replicas, finish=done, kv_blocks_total=engine_config.num_blocks)
        if new == routes:
            break
        routes = new
        per = tuple(simulate_serving([r for r, k in zip(requests, routes) if k == j], engine_config, cost)
                    if j in routes else PredictedServing({}, ()) for j in range(replicas))  # a replica sent nothing
        finish_s = {rid: times[-1] for p in per for rid, times in p.token_times_s.items()}
    ids = {r.request_id: g.request_id for r, g in zip(requests, given)}
    per = tuple(replace(p, token_times_s={ids[rid]: t for rid, t in p.token_times_s.items()}) for p in per)
    times = {rid: t for p in per for rid, t in p.token_times_s.items()}
    return PredictedReplicas(policy, {g.request_id: k for g, k in zip(given, routes)}, per, times, rounds)
