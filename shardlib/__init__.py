"""shardlib: tensor, pipeline and expert parallelism, shown on real ranks beside the formulas.

The package is layered; imports point down only (a test walks them):

* ``models``, ``hardware``, ``toy``, ``checks``: what everything shares. Model shapes, hardware facts
  with sources, the small transformer every demo runs, argument checks.
* ``runtime``: ``Ranks`` (a warm pool of rank processes), ``RankContext``, recorded collectives, spans.
* ``tensor_parallel``, ``pipeline``, ``experts``, ``costs``, ``plan``: one strategy each, every one with a
  pure part (formulas, schedules, routing), rank functions (``*_on_rank``) and drivers (``run_*``, called
  with a pool).
* ``ui``: figures, widgets, check-yourself questions, static export. ``exercises``: graders.

The runtime's main names are importable from here: ``from shardlib import Ranks``. They load on first
use, so ``import shardlib.models`` stays light.
"""

from ._lazy import exports

__all__, __getattr__, __dir__ = exports("shardlib.runtime", {
    "ranks": ("Ranks",),
    "errors": ("RankError", "RankTimeoutError"),
    "context": ("RankContext",),
    "records": ("CommRecord",),
    "timeline": ("Span",),
})
__version__ = "0.1.0"
