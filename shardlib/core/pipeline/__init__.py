"""Pipeline parallelism: schedules as data, one registry of them, and the engine one stage runs.

* ``classic``: The orders before the backward split, built as data: GPipe, 1F1B and interleaved 1F1B.
* ``engine``: The pipeline's mechanism: one stage works through its list of actions, in exactly the schedule's
  order.
* ``messages``: Messages between pipeline stages, posted ahead: every receive at the start, every send without
  waiting.
* ``orders``: ``make_schedule``: a pipeline schedule built from its spec in ``core.pipeline.registry``, and
  checked.
* ``registry``: The pipeline schedules, one ``ScheduleSpec`` each: the one place a schedule's facts live.
* ``schedules``: Pipeline schedules as data: ``Action``, ``Schedule``, ``check_schedule``, and ``simulate``
  that times them.
* ``stages``: Who holds what when stages are not equal: layers per stage set on purpose, and what it costs.
* ``zero_bubble``: The orders past 1F1B, built as data: ZB-H1, ZB-H2, ZB-V and DualPipeV, with the backward
  split in two.
"""

__all__ = ["classic", "engine", "messages", "orders", "registry", "schedules", "stages", "zero_bubble"]
