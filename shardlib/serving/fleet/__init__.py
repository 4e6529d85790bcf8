"""Serving at scale, past one engine: replicas behind a router, a replica's cold start, and the KV
hand-off's bytes for real models.

* ``router``: the routing policies (``ROUTERS``: round robin, least loaded, prefix-aware with a balance
  threshold), ``ReplicaLoad``, ``make_router``, ``route_trace`` (a pure replay).
* ``cold_start``: a replica's start measured (process, weights read from a checkpoint file, first step) and
  predicted (``run_cold_start_check``); ``burst_at_scale``, what a burst waits for a real model's new replica.
* ``presets``: for real models (``shardlib.models``), KV bytes per request and the link a request rate needs
  between a prefill pool and a decode pool (``handoff_need``, ``handoff_table``).
* ``traces``: ``hot_prefix_trace``, most requests under one system prompt, the rest unrelated.
* ``replicas``: ``replicas_on_rank``, replicas of the engine on ranks, the router co-hosted on rank 0.
* ``fleet_predict``: ``simulate_replicas``, the routing replayed and each replica on the fitted step cost.
* ``replica_drivers``: ``run_replicas`` -> ``ReplicaRun`` (the engine's result plus ``replica_of``);
  ``run_router_check`` (policies predicted, then served, one verdict per claim).
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
    "cold_start": (
        "run_cold_start_check",
        "ColdStart",
        "ReplicaStart",
        "cold_start_on_rank",
        "save_checkpoint",
        "load_checkpoint",
        "write_cold_start_files",
        "checkpoint_weights",
        "COLD_START_MODEL",
        "Storage",
        "STORAGE",
        "NVME_GEN4",
        "NETWORK_BLOCK",
        "OBJECT_STORE_100G",
        "BurstWait",
        "burst_at_scale",
        "warm_replicas_needed",
    ),
    "presets": (
        "REAL_MODELS",
        "HANDOFF_LINKS",
        "model_kv_bytes_per_request",
        "HandoffNeed",
        "handoff_need",
        "handoff_table",
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
