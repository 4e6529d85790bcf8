"""Communication costs measured on ranks, each beside its alpha-beta prediction.

* ``claims``: Notebook 02's measured claims, each a measurement and its verdicts.
* ``drivers``: Communication costs measured on a pool through ``lab.harness.on_ranks``, each beside its
  prediction.
* ``emulation``: A slower link between "nodes" of one machine, emulated: the toy cluster's network, made
  measurable.
* ``ranks``: Rank functions that show what communication costs: bursts of calls, a slow rank, serving.
"""

__all__ = ["claims", "drivers", "emulation", "ranks"]
