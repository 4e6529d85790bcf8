"""Serving predicted: one forward pass's cost, memory per GPU, the serving planner, the engine's scheduler
replayed on a fitted step cost, pools, goodput.

* ``burst``: A burst of requests met by warm replicas and cold starts, for a real model (pure: arithmetic, no
  ranks).
* ``cost``: One forward pass under tensor parallelism: the TP all-reduces, weights read, FLOPs.
* ``decode``: The planner's cost model: steady-state pipelined decode, and a prefill, for one layout.
* ``engine``: The engine's figures predicted: KV memory, the share of it real tokens hold, and times under
  load.
* ``fleet``: Replicas behind a router predicted: the routing replayed, each replica's engine on the fitted
  step cost.
* ``goodput``: A request's latency (``RequestMetrics``: TTFT, TPOT, end to end, its longest stall), and
  goodput: how many requests a second a deployment serves within its latency objectives.
* ``memory``: What a layout needs and whether it may: the workload, memory per GPU, the batch it affords, the
  rules; does a model fit on GPUs of a type, and how many it needs.
* ``planner``: The layout planner: every (tp, pp, dp, ep) of a model on a cluster, the feasible ones scored
  and ranked.
* ``pools``: Prefill pools and decode pools predicted on the engine's fitted step cost, the hand-off between
  them included, and how to split a fixed number of engines between the two.
* ``presets``: The KV hand-off for real models: bytes per request, and the link a request rate needs between
  pools.
* ``replicas``: Replicas against tensor parallelism: ``n`` copies of a model, or one copy split ``tp = n``
  ways, on ``n`` GPUs.
* ``traffic``: Where each mesh axis talks (a layout's kind and its counterpart across nodes), and what one
  forward pass sends along it.
"""

__all__ = ["burst", "cost", "decode", "engine", "fleet", "goodput", "memory", "planner", "pools", "presets",
           "replicas", "traffic"]
