"""The training step measured on ranks: against one process in float64, its ledger and its time.

* ``drivers``: The training step on a pool of ranks: every layout checked before any rank starts, run,
  gathered, compared; each rank's ledger measured.
* ``step_time``: Step time per layout: the training planner's time model on this machine's ranks, beside the
  measured step, and the ranking claim: predicted against measured step times over the layouts.
"""

__all__ = ["drivers", "step_time"]
