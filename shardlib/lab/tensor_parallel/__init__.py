"""Tensor and sequence parallelism measured on ranks, against the unsharded computation.

* ``drivers``: Tensor and sequence parallelism on a pool, against the unsharded computation, and in one
  process.
"""

__all__ = ["drivers"]
