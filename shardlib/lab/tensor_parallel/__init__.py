"""Tensor and sequence parallelism measured on ranks, against the unsharded computation.

* ``drivers``: Tensor and sequence parallelism against the unsharded computation: in one process, and on a
  pool.
* ``ranks``: Rank functions of tensor and sequence parallelism: a pair cut either way, and one block (the MLP,
  attention, or the whole block, tensor parallel alone or sequence parallel) forward and backward.
"""

__all__ = ["drivers", "ranks"]
