"""shardlib: how a model too big for one GPU is served and trained across many, on real ranks.

Tensor, pipeline, expert, data and context parallelism, each shown on real processes exchanging real
tensors beside the formula that predicts it. The layers, imports pointing down only:

* ``core``: the reference, the mechanisms of every strategy and their compositions (the training step,
  the serving engine), importing only ``torch`` and itself. Read it in an afternoon.
* ``facts``: real models' shapes and the hardware they run on, with sources. ``runtime``: ``Ranks``, a warm
  pool of rank processes, ``RankContext``, recorded collectives, spans.
* ``predict``: the formulas, cost models and planners (no ``torch.distributed``). ``lab``: the mechanisms
  run on ranks, against their references, beside their predictions.
* ``ui``: figures, widgets, check-yourself questions. ``exercises``: graders.

``from shardlib import Ranks`` works, and ``start_template``, which a notebook's first cell calls so that the
ranks' template imports torch while the cells before the first pool run. Both load on first use.
"""

from importlib import import_module

_HOME = {"Ranks": "ranks", "start_template": "launcher", "RankError": "errors", "RankTimeoutError": "errors",
         "RankContext": "context", "CommRecord": "records", "Span": "timeline"}
__all__ = ["core", "facts", "runtime", "predict", "lab", "ui", "exercises", *_HOME]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name in _HOME:
        return getattr(import_module(f"shardlib.runtime.{_HOME[name]}"), name)
    raise AttributeError(f"module 'shardlib' has no attribute {name!r}")
