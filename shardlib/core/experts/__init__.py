"""Expert parallelism: the router, the dispatch and combine by all-to-all, the experts' placement.

* ``autograd``: Expert parallelism that trains: a differentiable all-to-all and the dropless layer on ranks.
* ``balance``: Balancing the experts' load: capacity, dropping and rerouting; load statistics and the
  auxiliary loss.
* ``dispatch``: Expert parallelism, the mechanism: a mixture-of-experts layer whose experts live on different
  ranks.
* ``dropless``: Dropless experts: every token-slot served, however many rows each expert gets (no capacity).
* ``groups``: The expert groups of a ``Layout`` on a rank: its expert-parallel group, its expert-data-parallel
  group, and its stage's group, each a process group made once per pool and named in the comm log.
* ``node_limited``: Node-limited routing (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): each token's
  experts come from at most ``M`` nodes, so its cross-node traffic is bounded by ``M`` whatever the router
  prefers.
* ``overlap``: Two microbatches through the MoE layer, one's all-to-all in flight while the other computes.
* ``placement``: Where experts live, and how one home rank's token-slots are sent to them: the dispatch plan.
* ``routing``: The mixture-of-experts router: the layer's one configuration, the gate functions, the top-k
  choice.
* ``stack``: The toy transformer with mixture-of-experts MLPs: its seeded weights and its one-process forward.
"""

__all__ = ["autograd", "balance", "dispatch", "dropless", "groups", "node_limited", "overlap", "placement",
           "routing", "stack"]
