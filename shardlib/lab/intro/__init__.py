"""Notebook 00's measurements: ranks that say who they are, a first all-reduce, a straggler.

* ``drivers``: The measured claims of notebook 00, run on a pool and reported as one line each.
* ``ranks``: Rank functions for the first notebook: who am I, a first all-reduce, and a straggler.
"""

__all__ = ["drivers", "ranks"]
