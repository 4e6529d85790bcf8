"""Tensor and sequence parallelism measured on ranks, against the unsharded computation.

* ``drivers``: Tensor and sequence parallelism run on a pool, against the unsharded computation, in one call
  each.
* ``ranks``: Rank functions of tensor and sequence parallelism: the blocks, the two cut orders of a pair, and
  a block with sequence parallelism, each reporting what it computed and what it sent (from ``ctx.comm``) and,
  for sequence parallelism, the activation bytes autograd saved (``lab.measure.SavedBytes``).
* ``reference``: Tensor parallelism in one process: the column and row splits, the pair, and the toy stack
  summed.
"""

__all__ = ["drivers", "ranks", "reference"]
