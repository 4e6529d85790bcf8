"""Expert parallelism: the router, the dispatch and combine by all-to-all, the experts' placement.

* ``balance``: Balancing the experts' load: capacity, dropping and rerouting; load statistics and the
  auxiliary loss.
* ``dispatch``: The mixture-of-experts layer: route at home, dispatch by all-to-all, the experts, combine, the
  weighted sum.
* ``groups``: The expert groups of a ``Layout`` on a rank: its expert-parallel group, its expert-data-parallel
  group, and its stage's group, each a process group made once per pool and named in the comm log.
* ``overlap``: Two microbatches through the MoE layer, one's all-to-all in flight while the other computes.
* ``placement``: Where experts live, and how one home rank's token-slots are sent to them: the dispatch plan.
* ``routing``: The mixture-of-experts router: the layer's one configuration, the gate functions, the top-k
  choice.
* ``stack``: The toy transformer with mixture-of-experts MLPs: its seeded weights and its one-process forward.
"""

__all__ = ["balance", "dispatch", "groups", "overlap", "placement", "routing", "stack"]
