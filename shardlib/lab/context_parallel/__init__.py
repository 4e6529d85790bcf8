"""Context parallelism measured on ranks: ring, Ulysses and all-gather attention against the whole sequence's.

* ``claims``: Notebook 10's timing claims: zigzag's balance and the ring's overlap.
* ``drivers``: Context parallelism run on a pool through ``lab.harness``, against the unsharded attention, the
  work count and the cost model.
* ``grad_drivers``: Context parallelism's backward run on a pool: gradients against autograd, and training
  through the ring.
* ``ranks``: Context parallelism's rank functions: each method's attention on this rank's shard, training
  through the ring, and the ring's hop on its own.
* ``reference``: Context parallelism in one process: the whole-sequence attention every run is checked
  against, its gradients, the q/k/v checks, shards cut and joined, the ring played out, and a tiny attention
  layer.
"""

__all__ = ["claims", "drivers", "grad_drivers", "ranks", "reference"]
