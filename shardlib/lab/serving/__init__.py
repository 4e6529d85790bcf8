"""Serving measured on ranks: layouts, the engine against ``transformers``, the pools, replicas, cold starts.

* ``across``: Across two "nodes" of this machine, over an emulated slow link: tensor parallelism across them
  against pipeline stages across them, measured in steady-state decode beside the planner's prediction.
* ``cold_start``: A replica's cold start: the process started, the weights read from a checkpoint, the first
  engine step.
* ``disagg``: ``run_disaggregated``: a prefill pool and a decode pool on a warm pool of ranks; and
  ``run_disaggregation_check``: colocated against disaggregated on the same ranks and trace, each
  configuration predicted on a fitted step cost, then served.
* ``drivers``: A layout run on a pool and checked against its prediction, and the toy cluster measured: the
  layouts' rank functions, and the arithmetic speed of a rank.
* ``engine_drivers``: The serving engine on a warm pool, and configurations served on one trace, each
  predicted first.
* ``hf``: ``transformers`` as the engine's peer: a tiny random Llama, Mixtral or DeepSeek-V3, and a checkpoint
  read from disk.
* ``profile``: Where the engine's step spends its time: the engine in one process under cProfile, by group.
* ``replica_drivers``: Replicas of the engine behind a router on a warm pool; routing policies and "if it fits,
  run replicas" predicted, then served.
* ``traces``: Seeded request traces: what the engine is asked, and when.
"""

__all__ = ["across", "cold_start", "disagg", "drivers", "engine_drivers", "hf", "profile", "replica_drivers",
           "traces"]
