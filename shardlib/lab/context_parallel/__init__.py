"""Context parallelism measured on ranks: ring, Ulysses and all-gather attention against the whole sequence's.

* ``claims``: Notebook 10's timing claims as verdicts: zigzag's balance and the ring's overlap.
* ``drivers``: Context parallelism run on a pool, against the unsharded attention, the work count and the cost
  model.
* ``training``: Training through ring attention on a pool against the same steps in one process.
"""

__all__ = ["claims", "drivers", "training"]
