"""Serving at scale, past one engine: prefill and decode pools with the KV hand-off between them, goodput,
replicas behind a router, and a replica's cold start.

* ``handoff``: ``kv_bytes_per_request`` and the rank-side send and receive of one request's K/V, whole or
  layer by layer (``KVSender``, ``KVReceiver``).
* ``disagg``: ``disaggregated_on_rank``, a prefill pool and a decode pool in one job.
* ``goodput``: ``ServingObjective``, ``slo_attainment``, ``goodput`` (DistServe's, per GPU).
* ``pools``: the two pools replayed on a fitted step cost (``simulate_pools``), the hand-off included.
* ``drivers``: ``run_disaggregated`` (a ``DisaggregatedRun``).
* ``disagg_drivers``: ``run_disaggregation_check``, colocated against disaggregated, predicted then measured
  (a ``DisaggregationCheck``).
* ``router``: the routing policies (``ROUTERS``: round robin, least loaded, prefix-aware with a balance
  threshold), ``ReplicaLoad``, ``make_router``, ``route_trace`` (a pure replay).
* ``traces``: ``hot_prefix_trace``, most requests under one system prompt, the rest unrelated.
* ``replicas``: ``replicas_on_rank``, replicas of the engine on ranks, the router co-hosted on rank 0.
* ``fleet_predict``: ``simulate_replicas``, the routing replayed and each replica on the fitted step cost.
* ``replica_drivers``: ``run_replicas`` -> ``ReplicaRun`` (the engine's result plus ``replica_of``);
  ``run_router_check`` (policies predicted, then served, one verdict per claim).
* ``cold_start``: a replica's start measured (process, weights read from a checkpoint file, first step) and
  predicted (``run_cold_start_check``).
* ``burst``: ``burst_at_scale``, what a burst waits for a real model's new replica (pure).
* ``presets``: for real models (``shardlib.models``), KV bytes per request and the link a request rate needs
  between a prefill pool and a decode pool (``handoff_need``, ``handoff_table``).
* ``layout_drivers``: ``run_replicas_vs_tp_check``, one trace on replicas and on one copy split over every rank.
* ``splits``: a number of engines all colocated or split prefill : decode, predicted on a fitted step cost
  (``split_figures``: TTFT, TPOT, SLO attainment and goodput per engine).
"""

from ..._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "handoff": ("kv_bytes_per_request", "KVSender", "KVReceiver"),
    "disagg": ("disaggregated_on_rank", "DisaggRankResult"),
    "goodput": ("ServingObjective", "slo_attainment", "goodput"),
    "pools": ("simulate_pools", "PredictedPools", "admit_handed_off", "handoff_s"),
    "drivers": ("run_disaggregated", "DisaggregatedRun", "check_split"),
    "disagg_drivers": ("run_disaggregation_check", "DisaggregationCheck", "Interference", "interference",
                       "default_objectives", "CONFIGURATIONS"),
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
    ),
    "burst": (
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
        "rank_kv_heads",
        "rank_kv_bytes",
        "model_kv_bytes_per_request",
        "HandoffNeed",
        "handoff_need",
        "handoff_table",
    ),
    "layout_drivers": (
        "run_replicas_vs_tp_check",
        "ReplicasVsTPCheck",
    ),
    "splits": (
        "simulate_colocated",
        "simulate_split",
        "split_figures",
        "SplitFigures",
    ),
})
