"""What a learner sees: figures, widgets, check-yourself questions, static export, one theme.

* ``theme``: the palette every figure draws with. ``gantt``: the one Gantt builder. ``live``: the error
  line every widget shows its callbacks' failures in, instead of the log console.
* ``figures``, ``cost_figures``, ``pipeline_figures``, ``expert_figures``, ``plan_figures``: plotly
  figures, data in, figure out (no widgets, no processes).
* ``widgets`` (notebooks 00 and 01), ``cost_widgets``, ``pipeline_widgets``, ``expert_widgets``,
  ``plan_widgets``: sliders and knobs wired to the drivers and the figures.
* ``quiz``: check-yourself questions. ``static``: widgets and figures as still HTML for the site.

The UI sits on top: it may import anything below it, and nothing below imports it.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "theme": ("PALETTE", "KIND_COLOURS", "OP_COLOURS", "colour", "colours"),
    "gantt": ("Bar", "bar_traces", "gantt_figure"),
    "live": ("Feedback", "explain", "observe_all"),
    "figures": ("timeline_figure", "comm_bytes_figure", "weights_vs_memory_figure", "measured_points_figure",
                "shard_layout_figure", "weight_cut_figure"),
    "cost_figures": ("calibration_figure", "link_comparison_figure", "phase_cost_figure", "slow_rank_figure",
                     "replicas_vs_tp_figure", "latency_throughput_figure"),
    "pipeline_figures": ("schedule_figure", "measured_figure", "predicted_vs_measured_figure", "bubble_curve_figure",
                         "in_flight_figure", "step_through_figure"),
    "expert_figures": ("walkthrough_figure", "send_matrix_figure", "expert_load_figure", "rank_time_figure",
                       "mitigation_sweep_figure"),
    "plan_figures": ("plan_figure",),
    "data_parallel_figures": ("memory_per_rank_figure", "step_bytes_figure", "zero_table_figure",
                              "overlap_timeline_figure", "activation_figure"),
    "widgets": ("all_reduce_explorer", "tp_cut_explorer", "tp_wall_picker"),
    "cost_widgets": ("tp_cost_explorer", "slow_rank_explorer"),
    "pipeline_widgets": ("microbatch_explorer",),
    "expert_widgets": ("expert_explorer",),
    "plan_widgets": ("planner_widget",),
    "data_parallel_widgets": ("strategy_explorer",),
    "context_figures": ("ring_steps_figure", "block_owner_figure", "balance_figure", "ring_timeline_figure",
                        "method_bytes_figure", "memory_figure", "attention_memory_figure"),
    "context_widgets": ("sequence_explorer",),
    "quiz": ("Question", "check_yourself", "question_widget", "questions_html"),
    "static": ("install", "widget_html", "figure_html"),
})
