"""Tensor and sequence parallelism measured on ranks, against the unsharded computation.

* ``drivers``: Tensor and sequence parallelism run on a pool, against the unsharded computation, in one call
  each.
* ``ranks``: Rank functions of tensor and sequence parallelism: a pair cut either way, and one block (the MLP,
  attention, or the whole block, tensor parallel alone or sequence parallel) forward and backward.
* ``reference``: Tensor parallelism in one process: the column and row splits, the pair, and the toy stack
  summed.
"""

__all__ = ["drivers", "ranks", "reference"]
