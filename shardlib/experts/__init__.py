"""Expert parallelism: a mixture-of-experts layer's experts on different ranks, tokens routed by all-to-all.

* ``routing`` (pure): ``MoEConfig`` (with the load-imbalance knob), the top-k router, its load
  statistics and auxiliary loss, capacity, dropping and rerouting (and what a rerouted slot weighs).
* ``layer``: expert weights, the expert FFN and ``moe_reference``, the whole layer in one process.
* ``placement``: which rank holds which expert (replicas too, and their price in weight bytes), the
  dispatch plan, and the dispatch simulated in one process at any ``ep``.
* ``ranks``: ``ep_forward_on_rank``, the layer on a rank (two all-to-alls each way).
* ``drivers``: ``run_expert_parallel``, ``run_moe_policy`` and ``run_mitigations``, on a pool.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "routing": ("MoEConfig", "preference_bias", "BLOCK_ROWS", "MAX_PREFERENCE_BIAS", "blocked_rows", "Routing",
                "check_tokens", "route", "aux_load_balancing_loss", "capacity", "Assignment", "assign",
                "split_groups", "assign_groups", "served_gates", "REROUTE_GATES", "LoadStats", "load_stats"),
    "layer": ("MoEWeights", "make_moe_weights", "make_tokens", "expert_ffn", "weighted_sum", "combine", "MoEOutput",
              "moe_reference"),
    "placement": ("ExpertPlacement", "replicate_hottest", "DispatchPlan", "dispatch_plan", "run_hosted_experts",
                  "predicted_weight_bytes", "predicted_all_to_all_bytes", "predicted_cross_rank_share",
                  "check_layer_inputs",
                  "simulate_expert_parallel"),
    "ranks": ("ep_forward_on_rank",),
    "drivers": ("EPRun", "run_expert_parallel", "reference_for", "MITIGATIONS", "mitigated", "PolicyRun",
                "run_moe_policy", "run_mitigation", "run_mitigations"),
})
