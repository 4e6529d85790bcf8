"""Serving at scale, past one engine: replicas behind a router.

* ``router``: the routing policies (``ROUTERS``: round robin, least loaded, prefix-aware with a balance
  threshold), ``ReplicaLoad``, ``make_router``, ``route_trace`` (a pure replay).
* ``traces``: ``hot_prefix_trace``, most requests under one system prompt, the rest unrelated.
* ``replicas``: ``replicas_on_rank``, replicas of the engine on ranks, the router co-hosted on rank 0.
* ``fleet_predict``: ``simulate_replicas``, the routing replayed and each replica on the fitted step cost.
* ``replica_drivers``: ``run_replicas`` -> ``ReplicaRun`` (the engine's result plus ``replica_of``);
  ``run_router_check`` (policies predicted, then served, one verdict per claim).
* ``layout_drivers``: ``run_replicas_vs_tp_check``, one trace on replicas and on one copy split over every rank.
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
    "fleet_predict": (
        "simulate_replicas",
        "PredictedReplicas",
    ),
    "replica_drivers": (
        "run_replicas",
        "ReplicaRun",
        "check_replicas",
        "run_router_check",
        "RouterCheck",
        "HOT_PREFIX_POLICIES",
    ),
    "layout_drivers": (
        "run_replicas_vs_tp_check",
        "ReplicasVsTPCheck",
    ),
})
