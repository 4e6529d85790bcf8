"""The first steps of notebook 00: ranks that say who they are, a first all-reduce, a straggler.

* ``ranks``: the rank functions (``whoami_on_rank``, ``first_all_reduce_on_rank``, ``straggler_on_rank``,
  ``all_reduce_time_on_rank``).
* ``drivers``: the notebook's measured claims, one line each (``run_straggler_check``, ``run_failure_check``).
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "ranks": ("whoami_on_rank", "Whoami", "first_all_reduce_on_rank", "AllReduced", "straggler_on_rank",
              "StragglerTimes", "all_reduce_time_on_rank"),
    "drivers": ("run_straggler_check", "StragglerCheck", "run_failure_check", "FailureCheck"),
})
