"""Training predicted: memory per GPU, one step's time term by term, the training planner, published layouts
beside it.

* ``choices``: The training planner's choices for real models, dense and MoE, beside published training
  layouts: rows a notebook prints.
* ``ledger``: The toy language model's ledger per rank and its traffic per mesh axis, predicted. Pure: no
  torch.
* ``memory``: What one GPU of a training layout keeps: weights, gradients, optimizer state and activations,
  per stage.
* ``planner``: The training planner: every (tp, pp, dp, cp, ep, ZeRO stage) of a model on a cluster, ranked by
  tokens/s.
* ``published``: Published memory figures, each beside this package's memory model: rows a notebook prints.
* ``time_model``: What training one layout costs: the workload, and one step's time on a cluster, term by
  term.
* ``toy_prediction``: The toy's training step in the training planner's time model (no second model: the
  planner's, with the toy's settings listed once), and Spearman's rank correlation. Pure: numbers in, numbers
  out.
"""

__all__ = ["choices", "ledger", "memory", "planner", "published", "time_model", "toy_prediction"]
