"""Pipeline parallelism: schedules as data, one registry of them, and the engine one stage runs.

* ``engine``: The pipeline's mechanism: one stage works through its list of actions, in exactly the schedule's
  order.
* ``messages``: Messages between pipeline stages, posted ahead: every receive at the start, every send without
  waiting.
* ``orders``: Each schedule's order, built as data: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-H2, ZB-V and
  DualPipeV.
* ``registry``: The pipeline schedules, one ``ScheduleSpec`` each, and ``make_schedule`` that builds one.
* ``schedules``: Pipeline schedules as data: ``Action``, ``Schedule``, ``check_schedule``, and ``simulate``
  that times them.
* ``stages``: Who holds what when stages are not equal: layers per stage set on purpose, and what it costs.
"""

__all__ = ["engine", "messages", "orders", "registry", "schedules", "stages"]
