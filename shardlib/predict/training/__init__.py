"""Training predicted: memory per GPU, one step's time term by term, the training planner, published layouts
beside it. Pure: no torch.distributed.

* ``choices``: The planner's choices for real models, dense and MoE, beside published training layouts.
* ``ledger``: The toy language model's ledger per rank and its traffic per mesh axis. Pure: no torch.
* ``memory``: What one GPU of a training layout keeps: weights, gradients, optimizer state, activations.
* ``planner``: Every (tp, pp, dp, cp, ep, ZeRO stage) of a model on a cluster, ranked by tokens/s.
* ``published``: Published memory figures, each beside this package's memory model.
* ``time_model``: The workload, and one step's time on a cluster, term by term.
* ``toy_prediction``: The toy's step in the planner's time model, with the toy's settings listed once, and
  Spearman's rank correlation.
"""

__all__ = ["choices", "ledger", "memory", "planner", "published", "time_model", "toy_prediction"]
