"""Expert parallelism: a mixture-of-experts layer's experts on different ranks, tokens routed by all-to-all.

* ``routing`` (pure): ``MoEConfig`` (with the load-imbalance knob) and the top-k router.
* ``balance`` (pure): capacity, dropping and rerouting (and what a rerouted slot weighs), load
  statistics, the auxiliary loss, the mitigations.
* ``placement`` (pure): which rank holds which expert (replicas too), and one home rank's dispatch plan.
* ``reference`` (pure): expert weights, the expert FFN, ``moe_reference`` (the layer in one process),
  and the dispatch simulated in one process at any ``ep``.
* ``predict`` (pure): all-to-all bytes, the share of rows that leave home, expert weight bytes per rank.
* ``dispatch``: ``expert_parallel_moe``, the mechanism: route, all-to-all dispatch, expert FFNs,
  all-to-all combine, weighted sum at home.
* ``ranks``: ``ep_forward_on_rank``, the mechanism on a rank with its timing attached; ``overlap_on_rank``.
* ``gating`` (pure): ``MoETrainConfig``, the gate functions (``GATES``: Mixtral's, Switch's, DeepSeek-V3's),
  the trainable top-k with a selection bias.
* ``dropless`` (pure): every token-slot served, a loop over the experts on their row slices; the layer in
  one process.
* ``node_limited`` (pure): DeepSeek-V3's node-limited routing, the cross-node rows, the tokens it changed.
* ``all_to_all_cost`` (pure): what one dispatch costs on a cluster (inside a node, across nodes, node-limited),
  for the planners.
* ``stack`` (pure): the toy transformer with MoE MLPs, its weights and its one-process forward.
* ``groups``: a ``Layout``'s expert-parallel, expert-data-parallel and stage groups on a rank.
* ``autograd``: the differentiable all-to-all and ``moe_forward``, the dropless layer on ranks that trains.
* ``train_reference`` (pure): the toy's training step and SGD steps in one process.
* ``train_step``: ``moe_train_step``, gradients reduced over the dense and the expert-data-parallel groups.
* ``train_drivers``: ``run_moe_training`` (exact against one process), ``run_balance_training`` (the two
  balancing methods over training steps), ``run_node_limited`` (cross-node rows, limited and not).
* ``overlap``: two microbatches through the layer, one's all-to-all in flight under the other's experts
  (DualPipe's point); ``overlap_drivers``: ``run_overlap_check``, the exposed time measured with its verdicts.
* ``drivers``: ``run_expert_parallel``, ``run_moe_policy``, ``run_mitigation`` and ``run_mitigations``, on a pool;
  ``run_stall_check``, the stall measured with its verdict.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "routing": ("MoEConfig", "preference_bias", "BLOCK_ROWS", "MAX_PREFERENCE_BIAS", "REROUTE_GATES", "blocked_rows",
                "Routing", "check_tokens", "route"),
    "balance": ("capacity", "Assignment", "assign", "served_gates", "split_groups", "assign_groups",
                "aux_load_balancing_loss", "LoadStats", "load_stats", "MITIGATIONS", "mitigated", "BiasBalancing",
                "balance_by_bias", "switch_aux_loss", "bias_update"),
    "gating": ("GATES", "GateSpec", "BALANCING", "MoETrainConfig", "TrainRouting", "train_route"),
    "dropless": ("inverse_permutation", "grouped_experts", "gate_weighted_sum", "LayerOutput", "moe_layer"),
    "autograd": ("all_to_all", "LocalExperts", "MoEAux", "group_place", "moe_forward", "TrainDispatchPlan",
                 "plan_dispatch", "local_expert_rows", "weighted_at_home"),
    "train_reference": ("PARAMETERS", "MoETrainWeights", "MoEProblem", "make_moe_problem", "project", "task_loss",
                        "group_loss",
                        "ReferenceStep", "reference_step", "ReferenceRun", "train_steps_reference"),
    "train_step": ("EXPERT_PARAMETERS", "check_expert_layout", "expert_groups", "local_experts", "MoEStep",
                   "moe_train_step", "MoETrainResult", "moe_train_on_rank", "NodeDispatch", "node_dispatch_on_rank"),
    "node_limited": ("check_node_limit", "node_of_expert", "node_scores", "limit_to_nodes", "cross_node_rows",
                     "nodes_per_token", "tokens_changed"),
    "train_drivers": ("EXACT_RTOL", "relative_error", "MoETrainingRun", "run_moe_training", "BALANCE_CONFIG",
                      "BalanceTraining", "run_balance_training", "POLICIES", "NodeLimitedRun", "run_node_limited"),
    "placement": ("ExpertPlacement", "replicate_hottest", "DispatchPlan", "dispatch_plan"),
    "reference": ("MoEWeights", "make_moe_weights", "make_tokens", "expert_ffn", "apply_hosted_experts",
                  "weighted_sum", "combine", "MoEOutput", "moe_reference", "reference_for", "check_layer_inputs",
                  "EPSimulation", "simulate_expert_parallel"),
    "predict": ("BYTES_PER_VALUE", "predicted_weight_bytes", "predicted_all_to_all_bytes",
                "predicted_cross_rank_share", "predicted_exposed_s", "predicted_moe_step_bytes"),
    "dispatch": ("EPForward", "expert_parallel_moe"),
    "ranks": ("ep_forward_on_rank", "EPForwardResult", "overlap_on_rank", "OverlapResult"),
    "overlap": ("moe_two_microbatches",),
    "overlap_drivers": ("OVERLAP_LINK", "EXPOSED_BAND", "OverlapCheck", "run_overlap_check"),
    "drivers": ("EPRun", "run_expert_parallel", "PolicyRun", "run_moe_policy", "run_mitigation", "Mitigations",
                "run_mitigations", "StallCheck", "stall_verdicts", "run_stall_check"),
})
