"""Expert parallelism: the router, the dispatch and combine by all-to-all, the experts' placement.

* ``balance``: Balancing the experts' load: capacity, dropping and rerouting; load statistics and the
  auxiliary loss.
* ``dispatch``: The mixture-of-experts layer: route at home, dispatch by all-to-all, the experts, combine, the
  weighted sum; two microbatches overlapped; a ``Layout``'s expert groups; the toy transformer with MoE MLPs.
* ``placement``: Where experts live, and how one home rank's token-slots are sent to them: the dispatch plan.
* ``routing``: The mixture-of-experts router: the layer's one configuration, the gate functions, the top-k
  choice.
"""

__all__ = ["balance", "dispatch", "placement", "routing"]
