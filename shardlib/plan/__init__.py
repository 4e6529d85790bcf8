"""Choosing a layout, and running one: the planner and the combined layout on ranks.

* ``layout`` (pure): ``Layout(tp, pp, dp, ep)``, the one mesh: rank numbering and the groups per axis.
* ``memory`` (pure): ``Workload``, memory per GPU, the batch free memory affords, the shape rules.
* ``traffic`` (pure): which link each mesh axis uses, and the traffic of a forward pass per axis.
* ``decode`` (pure): the cost model: steady-state pipelined decode and prefill of one layout, ``score``.
* ``reasons`` (pure): the planner's reasons in words, TP across nodes against PP across nodes.
* ``planner`` (pure): every layout enumerated, rejected or scored, ranked: ``plan``, ``format_plan``.
* ``fit`` (pure): does a model fit one GPU, with how much room for KV cache; how many GPUs it needs.
* ``serving`` (pure): replicas against tensor parallelism, latency and throughput per GPU.
* ``ranks``: ``combined_forward_on_rank`` and ``decode_on_rank``, tensor parallelism inside a "node" and
  pipeline stages across "nodes", on a torch ``DeviceMesh`` built from a ``Layout``.
* ``across``: TP across two "nodes" against PP across them, over an emulated slow link, measured in
  decode beside the planner's prediction.
* ``drivers``: ``run_combined`` (a layout on a pool, against its predicted traffic), ``run_decode``
  (steady-state pipelined decode on a pool, optionally across an emulated slow link) and
  ``run_toy_cluster_calibration`` (the planner's cluster for the pool, measured).
* ``machines``: ``tp_inside_pp_across``, the same layout under ``torchrun`` across machines: tp = the
  processes of a node, pp = the nodes, checked against the reference on every rank.

Clusters and GPUs are facts, in ``shardlib.hardware``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "layout": ("Layout", "check_mesh"),
    "memory": ("Workload", "Memory", "memory_per_gpu", "weights_per_gpu", "kv_bytes_per_sequence", "affordable_batch",
               "batch_for", "active_params_per_gpu", "shape_problems", "memory_problem", "layout_problems",
               "check_layout"),
    "traffic": ("hop_links", "return_link", "axis_link", "pipeline_crosses_nodes", "tp_crosses_nodes", "AxisTraffic",
                "forward_traffic"),
    "decode": ("StageCost", "stage_costs", "Score", "score"),
    "reasons": ("TP_ACROSS", "PP_ACROSS", "kind", "counterpart", "compare"),
    "planner": ("OBJECTIVES", "Rejected", "Plan", "enumerate_layouts", "objective_workload", "plan", "format_plan",
                "format_choices"),
    "fit": ("GpuFit", "fit_on_gpus", "gpus_needed"),
    "serving": ("ServingPoint", "latency_vs_throughput", "format_latency_vs_throughput"),
    "across": ("AcrossRow", "AcrossNodes", "across_layouts", "across_workload", "run_across_nodes", "format_across"),
    "ranks": ("combined_forward_on_rank", "decode_on_rank", "effective_flops_per_s", "effective_flops_on_rank"),
    "drivers": ("TOLERANCE", "check_combined_inputs", "traffic_by_axis", "CombinedRun", "run_combined",
                "format_traffic", "DecodeRun", "run_decode", "ToyClusterFit", "run_toy_cluster_calibration"),
    "machines": ("across_layout", "tp_inside_pp_across", "tp_inside_pp_across_on_rank"),
})
