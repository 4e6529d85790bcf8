"""What a learner sees: figures, widgets, check-yourself questions, the code to read, static export.

* ``theme``: the one palette. ``gantt``: the one Gantt builder. ``live``: callback errors shown under the
  controls, not in the log console; a ``SelectionSlider`` safe at both ends. ``code``: ``show_code``.
* ``runtime_figures``: what any pool did (timelines, measured points).
* Per package, figures (data in, figure out) and widgets (controls wired to drivers and figures):
  ``intro_figures``, ``intro_widgets``; ``tensor_parallel_figures``, ``tensor_parallel_widgets``;
  ``costs_figures``, ``costs_widgets``; ``pipeline_figures``, ``pipeline_widgets``; ``experts_figures``,
  ``experts_widgets``; ``serving_figures``, ``serving_widgets``; ``engine_figures``, ``engine_widgets`` (the
  serving engine); ``fleet_figures``, ``fleet_widgets`` (serving at scale); ``data_parallel_figures``,
  ``data_parallel_widgets``; ``context_parallel_figures``, ``context_parallel_widgets``; ``training_figures``,
  ``training_widgets``.
* ``quiz``: check-yourself questions. ``static``: widgets and figures as still HTML for the site. ``mime``:
  ``MimeFigure``, a figure shown without importing plotly's renderers.

The UI sits on top: it may import anything below it, and nothing below imports it.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "theme": ("PALETTE", "KIND_COLOURS", "OP_COLOURS", "colour", "colours"),
    "gantt": ("Bar", "bar_traces", "gantt_figure"),
    "live": ("Feedback", "explain", "observe_all"),
    "runtime_figures": ("timeline_figure", "measured_points_figure"),
    "intro_figures": ("weights_vs_memory_figure",),
    "intro_widgets": ("all_reduce_explorer",),
    "tensor_parallel_figures": ("shard_layout_figure", "weight_cut_figure"),
    "tensor_parallel_widgets": ("tp_cut_explorer", "tp_wall_picker"),
    "costs_figures": ("calibration_figure", "link_comparison_figure", "phase_cost_figure", "slow_rank_figure",
                      "replicas_vs_tp_figure", "latency_throughput_figure"),
    "costs_widgets": ("tp_cost_explorer", "slow_rank_explorer"),
    "training_figures": ("loss_figure", "ledger_figure", "traffic_figure", "step_time_figure"),
    "training_widgets": ("training_explorer", "moe_layout_explorer"),
    "pipeline_figures": ("schedule_figure", "split_gantt_figure",
                         "measured_figure", "predicted_vs_measured_figure", "bubble_curve_figure",
                         "in_flight_figure", "step_through_figure"),
    "pipeline_widgets": ("microbatch_explorer", "zero_bubble_explorer"),
    "experts_figures": ("walkthrough_figure", "send_matrix_figure", "expert_load_figure", "rank_time_figure",
                        "mitigation_sweep_figure"),
    "experts_widgets": ("expert_explorer",),
    "serving_figures": ("plan_figure",),
    "serving_widgets": ("planner_widget",),
    "data_parallel_figures": ("memory_per_rank_figure", "step_bytes_figure", "zero_table_figure",
                              "overlap_timeline_figure", "activation_figure"),
    "data_parallel_widgets": ("strategy_explorer",),
    "context_parallel_figures": ("ring_steps_figure", "block_owner_figure", "balance_figure", "ring_timeline_figure",
                                 "method_bytes_figure", "memory_figure", "attention_memory_figure"),
    "context_parallel_widgets": ("sequence_explorer",),
    "code": ("show_code", "source_lines"),
    "quiz": ("Question", "show_questions", "question_widget", "questions_html"),
    "static": ("install", "widget_html", "figure_html"),
})
