"""Pipeline parallelism: cut the stack of layers into stages, and pay with the bubble.

* ``schedules`` (pure): ``Action`` and ``Schedule`` as data, their checks, and ``simulate``.
* ``registry`` (pure): one ``ScheduleSpec`` per schedule (order, chunks, placement, preconditions,
  published bubble, peak in flight, sources), read by everything that needs a schedule's facts.
* ``orders`` (pure): ``make_schedule``, a schedule built from its spec and checked.
* ``classic`` (pure): the GPipe, 1F1B and interleaved 1F1B orders.
* ``zero_bubble`` (pure): the orders past 1F1B (ZB-H1, ZB-H2, ZB-V, DualPipeV), the backward split in B and W.
* ``engine``: the mechanism, one stage walking its list of actions (forward, backward, weight gradient).
* ``messages``: the threads that send to and receive from the neighbouring stages.
* ``predict`` (pure): the bubble's two conventions, layers per stage, rows per microbatch; step time,
  idle slots, in-flight memory and messages from a schedule; the bubble and trips measured from spans.
* ``stages`` (pure): layers per stage when stages are not equal (``stage_layer_counts``, lighter end
  stages), and what the slowest stage costs (``stage_imbalance``, ``pipeline_step_s``).
* ``bubbles`` (pure): the published bubbles in both notations, ``OpCosts`` (F, B, W) read from spans.
* ``torch_peer``: torch's ZB-V, DualPipeV and interleaved zero-bubble orders read into a ``Schedule``,
  and ``torch_runtime_on_rank``, torch's own runtime for them on a rank.
* ``reference``: the stack in one process, microbatch by microbatch, and the input checks.
* ``ranks``: ``pipeline_step_on_rank``, the engine on a rank with spans, padding and memory meters.
* ``drivers``: ``run_pipeline`` and friends, which run steps on a pool and gather them; ``run_torch_runtime``.
* ``bubble_drivers``: ``run_split_bubble`` (the bubble of a split schedule against the published formulas);
  ``run_bubble_check``, ``run_pace_check``, ``run_uneven_check``, ``run_trip_check``: measured claims with
  their one-line verdicts.
* ``split_drivers``: ``run_zero_bubble_check``, those bubbles as one-line verdicts (predicted, measured, ratio).
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "schedules": ("OPS", "Action", "Schedule", "check_schedule", "TimedAction", "simulate", "ScheduleError",
                  "SCHEDULE_MISTAKES"),
    "registry": ("SCHEDULES", "SCHEDULE_TITLES", "SPECS", "ScheduleSpec", "Bubble", "InFlight", "schedule_spec",
                 "split_schedules"),
    "orders": ("make_schedule", "SPLIT_ORDERS"),
    "classic": ("gpipe_order", "one_f_one_b_order", "interleaved_order"),
    "zero_bubble": ("zb_h1_order", "zb_h2_order", "zb_v_order", "dualpipev_order"),
    "bubbles": ("OpCosts", "PUBLISHED", "published_idle_s", "published_fraction", "simulated_fraction", "busy_s",
                "notation_rows", "op_costs", "handover_s", "EQUAL_WITHIN"),
    "torch_peer": ("TORCH_SCHEDULES", "torch_grid", "torch_schedule", "TorchChunk", "torch_runtime_on_rank",
                   "import_pipelining_on_rank"),
    "bubble_drivers": ("SplitBubble", "run_split_bubble", "BubbleCheck", "run_bubble_check", "PaceCheck",
                       "run_pace_check", "UnevenCheck", "run_uneven_check", "TripCheck", "run_trip_check"),
    "split_drivers": ("SplitCase", "SplitStep", "SplitRun", "ZeroBubbleCheck", "run_split_cases", "split_verdicts",
                      "predicted_step_of", "run_zero_bubble_check"),
    "engine": ("Stage", "run_stage"),
    "predict": ("pipeline_bubble_fraction", "pipeline_bubble_ratio_to_ideal", "split_layers", "microbatch_sizes",
                "predicted_step_s", "idle_slots", "step_slots", "peak_in_flight", "messages_per_step",
                "MeasuredBubble", "compute_spans", "measure_bubble", "Trips", "microbatch_trips",
                "measured_in_flight", "schedule_text", "order_text"),
    "stages": ("check_layer_counts", "stage_layer_counts", "stage_imbalance", "pipeline_step_s"),
    "reference": ("unpipelined_step", "layers_of_stage", "check_pipeline_inputs"),
    "ranks": ("pipeline_step_on_rank", "StageResult", "toy_chunk"),
    "drivers": ("PipelineRun", "Exactness", "run_pipeline", "run_pipeline_median", "BubblePoint", "BubbleCurve",
                "run_bubble_curve", "PipelineVsTPBytes", "run_pipeline_vs_tp_bytes", "TorchRuntimeRun",
                "run_torch_runtime"),
})
