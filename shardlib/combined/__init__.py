"""Several strategies at once on ranks: a layout from ``shardlib.plan`` run for real.

* ``forward``: the mechanism, tensor parallelism inside a "node" and pipeline stages across "nodes" on a
  torch ``DeviceMesh`` built from a ``Layout``: ``build_stage``, ``combined_forward``, ``pipelined_decode``.
* ``ranks``: ``combined_forward_on_rank`` and ``decode_on_rank`` (the mechanism with spans and times
  attached), and the arithmetic speed of a rank.
* ``drivers``: ``run_combined`` (a layout on a pool, against its predicted traffic), ``run_decode``
  (steady-state pipelined decode, optionally across an emulated slow link) and
  ``run_toy_cluster_calibration`` (the planner's cluster for the pool, measured).
* ``across``: TP across two "nodes" against PP across them, over an emulated slow link, beside the planner.
* ``machines``: ``tp_inside_pp_across_on_rank``, the same layout under ``torchrun`` across machines.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "forward": ("RankStage", "build_stage", "combined_forward", "pipelined_decode"),
    "ranks": ("combined_forward_on_rank", "decode_on_rank", "effective_flops_per_s", "effective_flops_on_rank"),
    "drivers": ("check_combined_inputs", "traffic_by_axis", "CombinedRun", "run_combined",
                "format_traffic", "DecodeRun", "run_decode", "ToyClusterFit", "run_toy_cluster_calibration"),
    "across": ("AcrossRow", "AcrossNodes", "across_layouts", "across_workload", "run_across_nodes", "format_across"),
    "machines": ("across_layout", "tp_inside_pp_across_on_rank"),
})
