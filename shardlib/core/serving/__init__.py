"""The serving engine: requests, the block manager, the scheduler, one loop, the paged model, the hand-off, the
router.

* ``blocks``: The KV cache's block manager: fixed-size blocks, reference counts, and prefix caching.
* ``disagg``: ``disaggregated_on_rank``: a prefill pool and a decode pool of ranks in one job (Zhong et al.
  2024, DistServe; Patel et al. 2024, Splitwise).
* ``engine``: ``serving_engine_on_rank``: the engine on real ranks, the scheduler on rank 0, the model step on
  all.
* ``handoff``: The KV hand-off: one request's K and V from the prefill ranks that computed them to the decode
  ranks that will read them (Patel et al. 2024, Splitwise; Zhong et al. 2024, DistServe).
* ``layouts``: Tensor parallelism inside a "node", pipeline stages across "nodes": the combined forward on a
  rank.
* ``loop``: The engine's loop: admit what has arrived, schedule a step, run the model, sample, repeat.
* ``paged``: The model step on one rank: the Llama layers split over tensor parallelism, K/V in a paged cache.
* ``replicas``: ``replicas_on_rank``: replicas of the engine behind a router co-hosted on rank 0, on real
  ranks.
* ``requests``: What a serving engine is asked and how it is set: ``Request``, ``EngineConfig``, and a
  request's state.
* ``router``: Routing requests over replicas: round robin, least loaded, and prefix-aware with a balance
  threshold.
* ``scheduler``: The iteration-level scheduler: which tokens of which sequences one model step computes.
"""

__all__ = ["blocks", "disagg", "engine", "handoff", "layouts", "loop", "paged", "replicas", "requests",
           "router", "scheduler"]
