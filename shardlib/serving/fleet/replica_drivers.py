"""``run_replicas``: replicas of the engine behind a router on a warm pool, every input checked first.

Returns a ``ReplicaRun``: the engine's ``ServingRun`` (per request its tokens, token times and metrics,
on rank 0's clock) plus ``replica_of[request_id]``, and per replica its steps, prefix-cache hit rate and
the most requests the router saw queued there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...runtime.gather import gather
from ..engine.drivers import ServingRun, check_serving
from ..engine.requests import request_metrics
from .replicas import replicas_on_rank
from .router import make_router


@dataclass(frozen=True)
class ReplicaRun(ServingRun):
    """A ``ServingRun`` over replicas: ``steps`` are every replica's, in start order; ``tp`` is each
    replica's; ``replica_of[request_id]`` the replica that served it."""

    replica_of: dict = field(default_factory=dict)
    replicas: int = 1
    policy: str = "round-robin"
    replica_steps: tuple = ()  # per replica, its StepRecords
    replica_hit_tokens: tuple = ()
    replica_lookup_tokens: tuple = ()
    max_queued: tuple = ()  # per replica, the most requests the router saw queued there (routed, not finished)

    @property
    def routed(self) -> tuple[int, ...]:
        """Requests each replica served."""
        return tuple(sum(1 for k in self.replica_of.values() if k == r) for r in range(self.replicas))

    @property
    def replica_hit_rate(self) -> tuple[float, ...]:
        """Per replica: prompt tokens found in its prefix cache over those looked up."""
        return tuple(h / n if n else 0.0 for h, n in zip(self.replica_hit_tokens, self.replica_lookup_tokens))


def check_replicas(world_size: int, replicas) -> int:
    """The tensor-parallel degree inside a replica, or a ValueError in the learner's terms."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ValueError(f"replicas must be a whole number of at least 1, got {replicas!r}")
    if world_size % replicas:
        raise ValueError(f"{replicas} replicas do not divide {world_size} ranks: each replica needs the same number "
                         f"of ranks (try {', '.join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)})")
    return world_size // replicas


def run_replicas(ranks, weights, requests, config, replicas: int = 2, policy: str = "round-robin",
                 **router_options) -> ReplicaRun:
    """Serve ``requests`` on ``replicas`` replicas over ``ranks`` (each ``world / replicas`` ranks, tensor
    parallel inside), routed by ``policy`` (a name of ``router.ROUTERS``; ``router_options`` go to
    ``make_router``: ``balance_threshold``, ``by`` ...). Greedy unless a request has a seed."""
    tp = check_replicas(ranks.world_size, replicas)
    requests = check_serving(weights, requests, config, tp)
    make_router(policy, replicas, config.block_size, **router_options)  # an unknown policy or option fails here
    longest = max(len(r.prompt_token_ids) for r in requests)
    got = gather(ranks.run(replicas_on_rank, weights, requests, config, replicas, policy, router_options, longest))
    parts = got.results
    leaders = [p for p in parts if p.leader]
    head = parts[0]
    outputs = {requests[i].request_id: out for p in leaders for i, out in p.engine.outputs.items()}
    replica_of = {requests[i].request_id: k for i, k in enumerate(head.replica_of)}
    by_id = {r.request_id: r for r in requests}
    steps = tuple(sorted((s for p in leaders for s in p.engine.steps), key=lambda s: s.start_s))
    return ReplicaRun(
        tokens={rid: out[0] for rid, out in outputs.items()},
        token_times_s={rid: out[1] for rid, out in outputs.items()},
        metrics={rid: request_metrics(by_id[rid], out[1], out[2]) for rid, out in outputs.items()},
        steps=steps, kv_cache_bytes=tuple(p.engine.kv_cache_bytes for p in parts),
        prefix_hit_tokens=sum(p.engine.prefix_hit_tokens for p in leaders),
        prefix_lookup_tokens=sum(p.engine.prefix_lookup_tokens for p in leaders),
        preemptions=sum(p.engine.preemptions for p in leaders), tp=tp, block_size=config.block_size,
        replica_of=replica_of, replicas=replicas, policy=policy,
        replica_steps=tuple(p.engine.steps for p in leaders),
        replica_hit_tokens=tuple(p.engine.prefix_hit_tokens for p in leaders),
        replica_lookup_tokens=tuple(p.engine.prefix_lookup_tokens for p in leaders),
        max_queued=head.max_queued)
