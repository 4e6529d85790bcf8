"""The measurement side: each strategy's mechanism run on ``Ranks``, compared with its one-process reference and
set beside its prediction, one verdict line per claim.

* ``harness``: The one measurement harness: a function run on every rank, and what came back, read in one
  place.
* ``machines``: The toy forward and the training step under ``torchrun`` across machines: tp inside each
  machine.
* ``measure``: What a rank keeps: bytes a rank keeps, the peak of short-lived buffers, the bytes
  autograd saves.
* ``verdict``: A measured claim as a learner reads it: one line, predicted, measured, their ratio and a
  verdict.
* ``context_parallel``: Context parallelism measured on ranks: ring, Ulysses and all-gather attention against
  the whole sequence's.
* ``costs``: Communication costs measured on ranks, each beside its alpha-beta prediction.
* ``data_parallel``: Data parallelism measured on ranks: DDP and ZeRO against one process, bytes kept and
  sent.
* ``experts``: Expert parallelism measured on ranks: the layer against one process, load imbalance, training
  the router.
* ``intro``: Notebook 00's measurements: ranks that say who they are, a first all-reduce, a straggler.
* ``pipeline``: Pipeline steps measured on ranks: exactness, the bubble, the schedules' step times.
* ``serving``: Serving measured on ranks: layouts, the engine against ``transformers``, the pools, replicas,
  cold starts.
* ``tensor_parallel``: Tensor and sequence parallelism measured on ranks, against the unsharded computation.
* ``training``: The training step measured on ranks: against one process in float64, its ledger and its time.
"""

__all__ = ["harness", "machines", "measure", "verdict", "context_parallel", "costs", "data_parallel", "experts",
           "intro", "pipeline", "serving", "tensor_parallel", "training"]
