"""Data parallelism measured on ranks: DDP and ZeRO against one process, bytes kept and sent.

* ``activations``: Activations measured on one process: the bytes each layer keeps for its backward, with and
  without recomputation (Chen et al. 2016; torch ships it as ``torch.utils.checkpoint``).
* ``claims``: Notebook 08's measured claims: the collective identity and the overlap.
* ``drivers``: Data-parallel runs on a pool, gathered into frozen dataclasses and read against the formulas.
* ``peer``: PyTorch's own data parallelism on the same ranks: ``DistributedDataParallel`` and FSDP2's
  ``fully_shard``.
* ``ranks``: Data-parallel training on a rank, measured: the loop every strategy shares, and a collectives
  check.
* ``reference``: Data parallelism's reference: one process training on the whole batch with AdamW, and the
  input checks.
"""

__all__ = ["activations", "claims", "drivers", "peer", "ranks", "reference"]
