"""Exercises that check themselves: the learner writes a function, a grader compares it with the reference, on
live ranks where it matters.

* ``context_parallel``: Grader for the context-parallel exercise: merge two partial attention results with
  their max and sum.
* ``costs``: Grader for the communication-costs exercise: fit a latency and a bandwidth to a sweep of timings.
* ``data_parallel``: Grader for the data-parallel exercise: ZeRO-1's step on real ranks, designed by the
  learner.
* ``experts``: Graders for the expert-parallel exercises: a top-k router, and the dispatch plan of one home
  rank.
* ``experts_training``: Grader for the auxiliary-loss-free balancing exercise (DeepSeek-V3, 2024,
  arXiv:2412.19437, section 2.1.2).
* ``pipeline``: Graders for the pipeline exercises: one stage's 1F1B order, and the bubble fraction.
* ``pipeline_schedules``: Grader for the schedule exercise: the learner writes a pipeline schedule as a table
  of actions.
* ``result``: What a grader hands back: passed or not, and messages a learner can act on.
* ``serving``: Grader for the mesh exercise: a global rank's (stage, replica, tp rank), and its tp, pp and dp
  groups.
* ``serving_at_scale``: Grader: the prefix-aware router's choice with its balance threshold (serving at
  scale).
* ``serving_engine``: Grader: the block manager's ``allocate`` and ``free`` with prefix reuse (the serving
  engine's cache).
* ``tensor_parallel``: Graders for the tensor-parallel exercises: ``shard_rows``, and a column-then-row pair
  on real ranks.
* ``training``: Grader for the closing exercise: predict the bytes one training rank keeps, checked against
  its ledger.
* ``training_ledger``: The toy language model's ledger per rank as the training exercise models it, right or
  with a mistake made.
"""

__all__ = ["context_parallel", "costs", "data_parallel", "experts", "experts_training", "pipeline",
           "pipeline_schedules", "result", "serving", "serving_at_scale", "serving_engine", "tensor_parallel",
           "training", "training_ledger"]
