"""Choosing a layout: the planner, pure arithmetic on model and hardware facts (no ranks).

* ``layout`` (pure): ``Layout(tp, pp, dp, ep)``, the one mesh: rank numbering and the groups per axis.
* ``memory`` (pure): ``Workload``, memory per GPU, the batch free memory affords, the shape rules.
* ``traffic`` (pure): which link each mesh axis uses, and the traffic of a forward pass per axis.
* ``decode`` (pure): the cost model: steady-state pipelined decode and prefill of one layout, ``score``.
* ``reasons`` (pure): the planner's reasons in words, TP across nodes against PP across nodes.
* ``planner`` (pure): every layout enumerated, rejected or scored, ranked: ``plan``, ``format_plan``.
* ``fit`` (pure): does a model fit one GPU, with how much room for KV cache; how many GPUs it needs.
* ``serving`` (pure): replicas against tensor parallelism, latency and throughput per GPU.
* ``training_memory`` (pure): one training GPU's states and activations, per pipeline stage.
* ``published`` (pure): published memory figures (ZeRO, Megatron-LM, DeepSpeed, Korthikanti) beside ours.
* ``training`` (pure): ``TrainingWorkload``, one training step's time term by term.
* ``training_plan`` (pure): the training planner, ``plan(..., objective="training")``, ranked by tokens/s.
* ``training_choices`` (pure): its choices for Llama 3 models beside the Llama 3 paper's layouts.

Clusters and GPUs are facts, in ``shardlib.hardware``; running a layout on ranks is ``shardlib.combined``.
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
    "planner": ("OBJECTIVES", "TRAINING", "Rejected", "Plan", "enumerate_layouts", "objective_workload", "plan",
                "format_plan", "format_choices"),
    "fit": ("GpuFit", "fit_on_gpus", "gpus_needed"),
    "serving": ("ServingPoint", "latency_vs_throughput", "format_latency_vs_throughput"),
    "training_memory": ("TrainingMemory", "stage_params", "in_flight", "training_memory", "peak_training_memory"),
    "published": ("FigureRow", "zero_figure_rows", "megatron_rows", "deepspeed_zero3_estimate", "deepspeed_rows",
                  "activation_rows", "published_rows", "format_rows"),
    "training": ("TrainingWorkload", "TrainingScore", "model_flops_per_token", "axis_links", "score_training"),
    "training_plan": ("TrainingPlan", "plan_training", "best_configuration", "format_training_plan"),
    "training_choices": ("PublishedLayout", "LLAMA_3_PUBLISHED", "ChoiceRow", "training_choices",
                         "format_training_choices"),
})
