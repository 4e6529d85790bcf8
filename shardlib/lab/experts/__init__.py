"""Expert parallelism measured on ranks: the layer against one process, load imbalance, training the router.

* ``balance``: The experts' load measured on ranks, and the mitigations notebook 04 compares (a capacity cap,
  rerouting, a copy of the hottest expert), each beside the one-process layer under the same policy.
* ``drivers``: Expert parallelism run on a pool, each run set beside the one-process layer (``moe_reference``):
  one forward on each rank, its expert phase timed (``run_expert_parallel``); the skewed layer's stall as one
  verdict line (``run_stall_check``).
* ``node_limited``: Node-limited routing measured (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): the
  rows a dispatch sends off each token's home node, counted from the one-process routing and measured from
  the ranks' comm logs.
* ``overlap_drivers``: DualPipe's point measured: ``run_expert_overlap_check`` runs two microbatches through the MoE
  layer in turn and overlapped (``dispatch.moe_two_microbatches``) over an emulated slow link, and sets the
  exposed all-to-all time of each beside the alpha-beta prediction, one verdict line each
  (``lab.verdict``).
* ``training``: Notebook 11's MoE toy trained on ranks, and the same code in one process as its reference.
"""

__all__ = ["balance", "drivers", "node_limited", "overlap_drivers", "training"]
