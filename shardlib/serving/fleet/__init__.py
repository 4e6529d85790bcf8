"""Serving at scale, past one engine: prefill and decode pools, the KV hand-off between them, goodput.

* ``handoff``: ``kv_bytes_per_request`` and the rank-side send and receive of one request's K/V, whole or
  layer by layer (``KVSender``, ``KVReceiver``).
* ``disagg``: ``disaggregated_on_rank``, a prefill pool and a decode pool in one job.
* ``drivers``: ``run_disaggregated`` (a ``DisaggregatedRun``).
"""

from ..._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "handoff": ("kv_bytes_per_request", "KVSender", "KVReceiver"),
    "disagg": ("disaggregated_on_rank", "DisaggRankResult"),
    "drivers": ("run_disaggregated", "DisaggregatedRun", "check_split"),
})
