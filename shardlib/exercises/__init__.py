"""Exercises that check themselves: the learner writes a function, a grader compares it with the reference, on
live ranks where it matters.

* ``bubble``: Graders for the served pipeline's exercise (notebook 03): the bubble fraction and a pass's time.
* ``context_parallel``: Grader for the context-parallel exercise: merge two partial attention results with
  their max and sum.
* ``costs``: Grader for the communication-costs exercise: fit a latency and a bandwidth to a sweep of timings.
* ``data_parallel``: Grader for the data-parallel exercise: ZeRO-1's step on real ranks, designed by the
  learner.
* ``experts``: Graders for the expert-parallel exercises: a top-k router, one home rank's dispatch plan, and
  the auxiliary-loss-free bias on ranks.
* ``mesh``: Grader for the mesh exercise: a global rank's (stage, replica, tp rank), and its tp, pp and dp
  groups.
* ``pipeline``: Graders for the pipeline-schedule exercises (notebook 09): one stage's 1F1B order, and a
  schedule table.
* ``result``: What a grader hands back, and the checks every grader shares.
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

__all__ = ["bubble", "context_parallel", "costs", "data_parallel", "experts", "mesh", "pipeline", "result",
           "serving_at_scale", "serving_engine", "tensor_parallel", "training", "training_ledger"]
