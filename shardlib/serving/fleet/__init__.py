"""Serving at scale, past one engine: prefill and decode pools, the KV hand-off between them, goodput.

* ``handoff``: ``kv_bytes_per_request`` and the rank-side send and receive of one request's K/V, whole or
  layer by layer (``KVSender``, ``KVReceiver``).
* ``disagg``: ``disaggregated_on_rank``, a prefill pool and a decode pool in one job.
* ``goodput``: ``ServingObjective``, ``slo_attainment``, ``goodput`` (DistServe's, per GPU).
* ``pools``: the two pools replayed on a fitted step cost (``simulate_pools``), the hand-off included.
* ``drivers``: ``run_disaggregated`` (a ``DisaggregatedRun``).
* ``disagg_drivers``: ``run_disaggregation_check``, colocated against disaggregated, predicted then measured
  (a ``DisaggregationCheck``).
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
})
