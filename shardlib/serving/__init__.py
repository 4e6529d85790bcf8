"""Serving a model that does not fit one GPU: the cost model, the serving planner, and layouts on ranks.

Pure (no ranks, no torch):

* ``memory``: ``Workload`` (incl. kernel efficiency), memory per GPU, the batch free memory affords, the
  shape rules and their reasons.
* ``traffic``: which link each mesh axis uses; the traffic of a forward pass per axis.
* ``cost``: one forward pass under tensor parallelism: the TP all-reduces (every one the package prices),
  weights read and FLOPs; decode against prefill, the crossover batch, pipeline against tensor traffic.
* ``decode``: the serving cost model: steady-state pipelined decode (a token's trip, the slowest stage)
  and prefill of one layout, ``score``; floors unless a kernel efficiency is set.
* ``reasons``: the planner's reasons in words, TP across nodes against PP across nodes.
* ``planner``: every layout enumerated, rejected or scored, ranked: ``plan_serving``, ``format_plan``.
* ``fit``: does a model fit one GPU, with how much room for KV cache; how many GPUs it needs.
* ``replicas``: replicas against one copy split tp ways, latency per token and tokens/s per GPU (built on
  ``costs.predict.replicas_vs_tensor_parallel``).

On ranks:

* ``layouts``: the mechanism, tensor parallelism inside a "node" and pipeline stages across "nodes" (experts
  spread over ``ep`` ranks of a stage, for a model with experts) on a
  torch ``DeviceMesh`` built from a ``Layout``: ``build_stage``, ``combined_forward``, ``pipelined_decode``.
* ``ranks``: ``combined_forward_on_rank`` and ``decode_on_rank`` (the mechanism with spans and times
  attached), and the arithmetic speed of a rank.
* ``drivers``: ``run_combined`` (a layout on a pool, against its predicted traffic), ``run_decode``
  (steady-state pipelined decode, optionally across an emulated slow link) and
  ``run_toy_cluster_calibration`` (the planner's cluster for the pool, measured).
* ``across``: TP across two "nodes" against PP across them, over an emulated slow link, beside the planner.
* ``machines``: ``tp_inside_pp_across_on_rank``, the same layout under ``torchrun`` across machines.
* ``engine``: a serving engine on the ranks (requests, continuous batching, paged KV cache, chunked prefill).

The mesh itself (``Layout``) is ``shardlib.mesh``; hardware facts are ``shardlib.hardware``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "memory": ("Workload", "memory_per_gpu", "weights_per_gpu", "kv_bytes_per_sequence", "affordable_batch",
               "active_params_per_gpu", "shape_problems", "memory_problem", "layout_problems",
               "check_layout", "stack_weight_bytes"),
    "traffic": ("hop_links", "return_link", "axis_link", "pipeline_crosses_nodes", "tp_crosses_nodes", "AxisTraffic",
                "forward_traffic"),
    "cost": ("ALL_REDUCES_PER_LAYER", "TPAllReduces", "tp_all_reduces", "PhaseCost", "tp_forward_cost",
             "tp_decode_cost", "tp_prefill_cost", "tp_cost_table", "format_tp_cost_table", "decode_crossover_batch",
             "PipelineVsTensor", "pipeline_vs_tensor", "decode_step_compute_s", "forward_flops", "layer_read_bytes",
             "fits_on_device"),
    "decode": ("StageCost", "stage_costs", "Score", "score", "ep_all_to_all"),
    "reasons": ("TP_ACROSS", "PP_ACROSS", "kind", "counterpart", "compare"),
    "planner": ("OBJECTIVES", "Plan", "enumerate_layouts", "objective_workload", "plan_serving",
                "format_plan"),
    "fit": ("GpuFit", "fit_on_gpus", "gpus_needed"),
    "replicas": ("ServingPoint", "replicas_against_tp", "latency_vs_throughput", "format_latency_vs_throughput"),
    "layouts": ("RankStage", "RankExperts", "build_stage", "moe_mlp", "run_blocks", "combined_forward",
                "pipelined_decode"),
    "ranks": ("combined_forward_on_rank", "CombinedResult", "decode_on_rank", "DecodeResult", "effective_flops_per_s",
              "effective_flops_on_rank"),
    "drivers": ("check_combined_inputs", "check_expert_inputs", "traffic_by_axis", "CombinedRun", "run_combined",
                "WideEPComparison", "run_wide_ep", "format_traffic", "DecodeRun", "run_decode", "ToyClusterFit",
                "run_toy_cluster_calibration"),
    "across": ("AcrossRow", "AcrossNodes", "across_layouts", "across_workload", "run_across_nodes", "format_across",
               "check_across_nodes", "across_verdicts"),
    "machines": ("across_layout", "tp_inside_pp_across_on_rank", "AcrossResult"),
})
