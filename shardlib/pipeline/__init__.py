"""Pipeline parallelism: cut the stack of layers into stages, and pay with the bubble.

* ``bubble`` (pure): the bubble's two conventions, layers per stage, rows per microbatch.
* ``schedules`` (pure): GPipe, 1F1B and interleaved 1F1B as data, checked, and ``simulate``.
* ``predict`` (pure): step time, idle slots, in-flight memory and messages from a schedule; the idle
  fraction, in-flight count and each microbatch's trip measured from a real run's spans.
* ``reference``: the stack in one process, microbatch by microbatch, and the input checks.
* ``ranks``: ``pipeline_step_on_rank``, one stage working through its list of actions.
* ``drivers``: ``run_pipeline`` and friends, which run steps on a pool and gather them.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "bubble": ("pipeline_bubble_fraction", "pipeline_bubble_ratio_to_ideal", "split_layers", "microbatch_sizes"),
    "schedules": ("OPS", "SCHEDULES", "SCHEDULE_TITLES", "Action", "Schedule", "make_schedule", "check_schedule",
                  "TimedAction", "simulate"),
    "predict": ("predicted_step_s", "idle_slots", "step_slots", "peak_in_flight", "messages_per_step",
                "MeasuredBubble", "compute_spans", "measure_bubble", "Trips", "microbatch_trips",
                "measured_in_flight", "schedule_text",
                "order_text"),
    "reference": ("unpipelined_step", "layers_of_stage", "check_pipeline_inputs"),
    "ranks": ("pipeline_step_on_rank",),
    "drivers": ("PipelineRun", "Exactness", "run_pipeline", "run_pipeline_median", "BubblePoint",
                "run_bubble_curve", "PipelineVsTPBytes", "run_pipeline_vs_tp_bytes", "TOLERANCE"),
})
