"""shardlib: how a model too big for one GPU is served and trained across many, on real ranks.

Tensor, pipeline, expert, data and context parallelism, each shown on real processes exchanging real
tensors beside the formula that predicts it, and composed the way real deployments combine them. The
package is organised by workload; imports point down only (a test walks them):

* ``checks``, ``models``, ``hardware``, ``toy``, ``mesh``, ``units``: what everything shares. Model shapes,
  hardware facts with sources, the small transformer every demo runs, the device mesh (``Layout``).
* ``runtime``: ``Ranks`` (a warm pool of rank processes), ``RankContext``, recorded collectives, spans.
* ``tensor_parallel``, ``pipeline``, ``experts``, ``data_parallel``, ``context_parallel``: one strategy each,
  with its mechanism, a one-process reference, predictions, rank functions and drivers; ``costs``: the
  alpha-beta model of one collective and its calibration on the ranks.
* ``serving``, ``training``: the workloads, composed from the strategies' own mechanisms: cost models,
  planners (``plan_serving``, ``plan_training``), and layouts run on ranks.
* ``ui``: figures, widgets, check-yourself questions, static export. ``exercises``: graders.

The runtime's main names are importable from here: ``from shardlib import Ranks``, and ``start_template``,
which a notebook's first cell calls so that the ranks' template imports torch while the cells before the
first pool run. They load on first use, so ``import shardlib.models`` stays light.
"""

from ._lazy import exports

__all__, __getattr__, __dir__ = exports("shardlib.runtime", {
    "ranks": ("Ranks",),
    "launcher": ("start_template",),
    "errors": ("RankError", "RankTimeoutError"),
    "context": ("RankContext",),
    "records": ("CommRecord",),
    "timeline": ("Span",),
})
__version__ = "0.1.0"
