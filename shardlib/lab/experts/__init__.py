"""Expert parallelism measured on ranks: the layer against one process, load imbalance, training the router.

* ``balance``: The experts' load read and balanced from outside the layer: load statistics, the auxiliary
  loss's value, the mitigations notebook 04 compares, and DeepSeek-V3's bias balancing played over batches.
* ``drivers``: Expert parallelism run on a pool: one forward gathered (``run_expert_parallel``), and the load-
  imbalance knob against each mitigation (``run_moe_policy``, ``run_mitigation``, ``run_mitigations``), each
  run compared with the single-process layer under the same policy. ``run_stall_check``: the skewed layer's
  stall as a learner reads it, one verdict line (``lab.verdict``).
* ``overlap_drivers``: DualPipe's point measured: ``run_expert_overlap_check`` runs two microbatches through the MoE
  layer in turn and overlapped (``overlap.moe_two_microbatches``) over an emulated slow link, and sets the
  exposed all-to-all time of each beside the alpha-beta prediction, one verdict line each
  (``lab.verdict``).
* ``ranks``: Expert parallelism on a rank: ``dispatch.expert_parallel_moe`` with its timing attached.
* ``reference``: The mixture-of-experts layer in one process: expert weights, the expert FFN,
  ``moe_reference``.
* ``train_drivers``: The MoE training step run on a pool: ``run_moe_training`` (steps of SGD, gathered, set
  beside the one-process reference in float64), ``run_balance_training`` (Switch's auxiliary loss against
  DeepSeek-V3's auxiliary-loss-free bias over training steps: the loads per expert per step) and
  ``run_node_limited`` (the cross-node rows of node-limited routing against unlimited, predicted and
  measured).
* ``train_reference``: The MoE training step in one process: what ``train_step.moe_train_step`` on ranks must
  equal.
* ``train_step``: The MoE training step of notebook 04's toy on a rank: ``core.experts.autograd.moe_forward``,
  the loss, the backward, each gradient summed over the ranks that share its weight.
"""

__all__ = ["balance", "drivers", "overlap_drivers", "ranks", "reference", "train_drivers", "train_reference",
           "train_step"]
