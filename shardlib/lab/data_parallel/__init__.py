"""Data parallelism measured on ranks: DDP and ZeRO against one process, bytes kept and sent.

* ``activations``: Activations measured on one process: the bytes each layer keeps for its backward, with and
  without recomputation (Chen et al. 2016; torch ships it as ``torch.utils.checkpoint``).
* ``claims``: Notebook 08's timed comparisons on a pool and their claims: the collective identity and the
  overlap.
* ``drivers``: Data-parallel runs on a pool, read from what ``lab.harness.on_ranks`` gathered and set beside
  the formulas.
* ``peer``: PyTorch's own data parallelism on the same ranks: ``DistributedDataParallel`` and FSDP2's
  ``fully_shard``.
* ``ranks``: Data parallelism's rank functions: the training loop every strategy shares, and one buffer
  summed two ways.
* ``reference``: Data parallelism's reference: one process training on the whole batch with AdamW, and the
  input checks.
"""

__all__ = ["activations", "claims", "drivers", "peer", "ranks", "reference"]
