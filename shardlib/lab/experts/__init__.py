"""Expert parallelism measured on ranks: the layer against one process, load imbalance, training the router.

* ``balance``: The experts' load read from outside the layer: load statistics, and the mitigations notebook 04
  compares (``replicate_hottest`` plans the copy of the hottest expert).
* ``drivers``: Expert parallelism run on a pool, each run set beside the one-process layer (``moe_reference``):
  one forward gathered (``run_expert_parallel``), the load-imbalance knob against each mitigation
  (``run_moe_policy``, ``run_mitigation``, ``run_mitigations``), the skewed layer's stall as one verdict line
  (``run_stall_check``).
* ``node_limited``: Node-limited routing measured (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): the
  rows a dispatch sends off each token's home node, counted from the one-process routing and measured from
  the ranks' comm logs.
* ``overlap_drivers``: DualPipe's point measured: ``run_expert_overlap_check`` runs two microbatches through the MoE
  layer in turn and overlapped (``overlap.moe_two_microbatches``) over an emulated slow link, and sets the
  exposed all-to-all time of each beside the alpha-beta prediction, one verdict line each
  (``lab.verdict``).
* ``ranks``: Expert parallelism's rank functions: the core layer on this rank's share of the batch, with a probe
  that times the expert phase.
* ``training``: Notebook 04's MoE toy trained on ranks, and the same code in one process as its reference.
"""

__all__ = ["balance", "drivers", "node_limited", "overlap_drivers", "ranks", "training"]
