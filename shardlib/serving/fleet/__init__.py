"""Serving at scale, past one engine: prefill and decode pools with the KV hand-off between them, goodput, and
replicas behind a router.

* ``handoff``: ``kv_bytes_per_request`` and the rank-side send and receive of one request's K/V, whole or
  layer by layer (``KVSender``, ``KVReceiver``).
* ``disagg``: ``disaggregated_on_rank``, a prefill pool and a decode pool in one job.
* ``drivers``: ``run_disaggregated`` (a ``DisaggregatedRun``).
* ``router``: the routing policies (``ROUTERS``: round robin, least loaded, prefix-aware with a balance
  threshold), ``ReplicaLoad``, ``make_router``, ``route_trace`` (a pure replay).
* ``traces``: ``hot_prefix_trace``, most requests under one system prompt, the rest unrelated.
* ``replicas``: ``replicas_on_rank``, replicas of the engine on ranks, the router co-hosted on rank 0.
* ``fleet_predict``: ``simulate_replicas``, the routing replayed and each replica on the fitted step cost.
* ``replica_drivers``: ``run_replicas`` -> ``ReplicaRun`` (the engine's result plus ``replica_of``);
  ``run_router_check`` (policies predicted, then served, one verdict per claim).
"""

from ..._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "handoff": ("kv_bytes_per_request", "KVSender", "KVReceiver"),
    "disagg": ("disaggregated_on_rank", "DisaggRankResult"),
    "drivers": ("run_disaggregated", "DisaggregatedRun", "check_split"),
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
    ),
})
