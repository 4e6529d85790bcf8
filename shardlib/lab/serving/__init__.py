"""Serving measured on ranks: layouts, the engine against ``transformers``, the pools, replicas, cold starts.

* ``across``: Across two "nodes" of this machine, over an emulated slow link: tensor parallelism across them
  against pipeline stages across them, measured in steady-state decode beside the planner's prediction.
* ``cold_start``: A replica's cold start: the process started, the weights read from a checkpoint, the first
  engine step.
* ``disagg_drivers``: ``run_disaggregation_check``: colocated against disaggregated on the same ranks and
  trace, each configuration predicted on a fitted step cost, then served; the claims a notebook prints as one
  line each.
* ``disagg_run``: ``run_disaggregated``: a prefill pool and a decode pool on a warm pool of ranks, every
  request checked before any rank starts.
* ``drivers``: A layout run on a pool and checked against its prediction, and the toy cluster measured.
* ``engine_drivers``: ``run_serving``: the engine on a warm pool, every request checked before any rank
  starts.
* ``fleet_traces``: A trace for routers: one hot system prompt that most requests share, the rest unrelated
  prompts.
* ``hf``: ``transformers`` as the engine's peer: a tiny random Llama, and a checkpoint read from disk.
* ``layout_drivers``: ``run_replicas_vs_tp_check``: "if it fits, run replicas", request by request, on real
  ranks.
* ``machines``: Tensor parallelism inside each machine, pipeline stages across machines, under ``torchrun``.
* ``ranks``: The combined forward and decode on ranks, with measurement attached, and the arithmetic speed of
  a rank.
* ``replica_drivers``: ``run_replicas``: replicas of the engine behind a router on a warm pool, every input
  checked first.
* ``traces``: Seeded request traces: what the engine is asked, and when.
"""

__all__ = ["across", "cold_start", "disagg_drivers", "disagg_run", "drivers", "engine_drivers", "fleet_traces",
           "hf", "layout_drivers", "machines", "ranks", "replica_drivers", "traces"]
