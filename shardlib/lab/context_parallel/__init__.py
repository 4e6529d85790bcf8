"""Context parallelism measured on ranks: ring, Ulysses and all-gather attention against the whole sequence's.

* ``claims``: Notebook 10's timing claims as verdicts: zigzag's balance and the ring's overlap.
* ``drivers``: Context parallelism run on a pool, against the unsharded attention, the work count and the cost
  model.
* ``ranks``: Context parallelism's rank functions: each method's attention on this rank's shard, training
  through the ring, and the ring's hop on its own.
"""

__all__ = ["claims", "drivers", "ranks"]
