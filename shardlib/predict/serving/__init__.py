"""Serving predicted: one forward pass's cost, memory per GPU, the serving planner, the engine's scheduler
replayed on a fitted step cost, pools, goodput.

* ``burst``: A burst of requests met by warm replicas and cold starts, for a real model (pure: arithmetic, no
  ranks).
* ``cost``: One forward pass under tensor parallelism: the TP all-reduces, weights read, FLOPs.
* ``decode``: The planner's cost model: steady-state pipelined decode, and a prefill, for one layout.
* ``engine``: The engine's figures predicted: KV memory, the share of it real tokens hold, and times under
  load.
* ``fit``: Does a model fit: on one GPU, with how much room left for KV cache; and how many GPUs it needs.
* ``fleet``: Replicas behind a router predicted: the routing replayed, each replica's engine on the fitted
  step cost.
* ``goodput``: Goodput: how many requests a second a deployment serves within its latency objectives.
* ``memory``: What a layout needs and whether it may: the workload, memory per GPU, the batch it affords, the
  rules.
* ``planner``: The layout planner: every (tp, pp, dp, ep) of a model on a cluster, the feasible ones scored
  and ranked.
* ``pools``: A prefill pool and a decode pool predicted on the engine's fitted step cost, the hand-off between
  them included.
* ``presets``: The KV hand-off for real models: bytes per request, and the link a request rate needs between
  pools.
* ``reasons``: The planner's reasons, in words a learner reads: what set the batch, where a token's time goes,
  and how a layout that crosses nodes with its pipeline compares with the one that crosses them with tensor
  parallelism (the same GPUs per copy, cut the other way), which won and by how much.
* ``replicas``: Replicas against tensor parallelism: ``n`` copies of a model, or one copy split ``tp = n``
  ways, on ``n`` GPUs.
* ``splits``: How to split a fixed number of engines between prefill and decode, predicted on a fitted step
  cost.
* ``traffic``: Where each mesh axis talks, and what one forward pass sends along it.
"""

__all__ = ["burst", "cost", "decode", "engine", "fit", "fleet", "goodput", "memory", "planner", "pools", "presets",
           "reasons", "replicas", "splits", "traffic"]
