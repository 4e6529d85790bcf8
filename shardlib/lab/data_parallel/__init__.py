"""Data parallelism measured on ranks: DDP and ZeRO against one process, bytes kept and sent.

* ``activations``: Activations measured on one process: the bytes each layer keeps for its backward, with and
  without recomputation (Chen et al. 2016).
* ``claims``: Notebook 08's timed comparisons on a pool and their claims: the collective identity and the
  overlap.
* ``drivers``: Data-parallel runs on a pool: the training loop every strategy shares on each rank, read from
  what ``lab.harness.on_ranks`` gathered and set beside the formulas, and PyTorch's own DDP and FSDP2.
* ``reference``: Data parallelism's reference: one process training on the whole batch with AdamW, and the
  input checks.
"""

__all__ = ["activations", "claims", "drivers", "reference"]
