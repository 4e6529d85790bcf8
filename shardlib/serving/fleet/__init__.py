"""Serving at scale, past one engine: replicas behind a router.

* ``router``: the routing policies (``ROUTERS``: round robin, least loaded, prefix-aware with a balance
  threshold), ``ReplicaLoad``, ``make_router``, ``route_trace`` (a pure replay).
* ``traces``: ``hot_prefix_trace``, most requests under one system prompt, the rest unrelated.
* ``replicas``: ``replicas_on_rank``, replicas of the engine on ranks, the router co-hosted on rank 0.
* ``replica_drivers``: ``run_replicas`` -> ``ReplicaRun`` (the engine's result plus ``replica_of``).
"""

from ..._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "router": (
        "ReplicaLoad",
        "Router",
        "RoundRobinRouter",
        "LeastLoadedRouter",
        "PrefixAwareRouter",
        "PrefixTree",
        "ROUTERS",
        "make_router",
        "route_trace",
        "prompt_block_hashes",
    ),
    "traces": (
        "hot_prefix_trace",
    ),
    "replicas": (
        "replicas_on_rank",
        "ReplicaRankResult",
    ),
    "replica_drivers": (
        "run_replicas",
        "ReplicaRun",
        "check_replicas",
    ),
})
