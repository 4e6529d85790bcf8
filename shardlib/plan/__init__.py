"""Choosing a layout, and running one: the planner and the combined layout on ranks.

* ``layout`` (pure): ``Layout(tp, pp, dp, ep)``, the one mesh: rank numbering and the groups per axis.
* ``memory`` (pure): ``Workload``, memory per GPU, the shape rules and their reasons.
* ``planner`` (pure): the traffic of a forward pass per mesh axis, scores, and ``plan``.
* ``ranks``: ``combined_forward_on_rank``, tensor parallelism inside a "node" and pipeline stages across
  "nodes", on a torch ``DeviceMesh`` built from a ``Layout``.
* ``drivers``: ``run_combined`` (a layout on a pool, against its predicted traffic) and
  ``run_toy_cluster_calibration`` (the planner's cluster for the pool, measured).

Clusters and GPUs are facts, in ``shardlib.hardware``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "layout": ("Layout", "check_mesh"),
    "memory": ("Workload", "Memory", "memory_per_gpu", "active_params_per_gpu", "layout_problems", "check_layout"),
    "planner": ("OBJECTIVES", "hop_links", "axis_link", "AxisTraffic", "forward_traffic", "Score", "score",
                "Rejected", "Plan", "enumerate_layouts", "plan", "format_plan"),
    "ranks": ("combined_forward_on_rank",),
    "drivers": ("TOLERANCE", "check_combined_inputs", "traffic_by_axis", "CombinedRun", "run_combined",
                "format_traffic", "effective_flops_per_s", "ToyClusterFit", "run_toy_cluster_calibration"),
})
