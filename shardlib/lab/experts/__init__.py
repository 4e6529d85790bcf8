"""Expert parallelism measured on ranks: the layer against one process, load imbalance, training the router.

* ``balance``: The experts' load read from outside the layer: load statistics, the auxiliary loss's value, and
  the mitigations notebook 04 compares.
* ``drivers``: Expert parallelism run on a pool: one forward gathered (``run_expert_parallel``), and the load-
  imbalance knob against each mitigation (``run_moe_policy``, ``run_mitigation``, ``run_mitigations``), each
  run compared with the single-process layer under the same policy. ``run_stall_check``: the skewed layer's
  stall as a learner reads it, one verdict line (``lab.verdict``).
* ``node_limited``: Node-limited routing measured (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): the
  rows a dispatch sends off each token's home node, counted from the one-process routing and measured from
  the ranks' comm logs.
* ``overlap_drivers``: DualPipe's point measured: ``run_expert_overlap_check`` runs two microbatches through the MoE
  layer in turn and overlapped (``overlap.moe_two_microbatches``) over an emulated slow link, and sets the
  exposed all-to-all time of each beside the alpha-beta prediction, one verdict line each
  (``lab.verdict``).
* ``ranks``: Expert parallelism's rank functions: the core layer on this rank's share of the batch, with a probe
  that times the expert phase.
* ``reference``: The mixture-of-experts layer in one process, what the layer on ranks must equal:
  ``moe_reference``.
* ``train_drivers``: Notebook 04's MoE toy trained on a pool and set beside one process.
* ``train_reference``: The MoE training step in one process: what ``train_step.moe_train_on_rank`` on ranks must
  equal.
* ``train_step``: Notebook 04's MoE toy on a rank: a dense input projection ``w_in``, then the training step's MoE
  layer (``core.training.moe_block.MoEMLP``) with its residual, trained by plain SGD.
"""

__all__ = ["balance", "drivers", "node_limited", "overlap_drivers", "ranks", "reference", "train_drivers",
           "train_reference", "train_step"]
