"""One language model trained over dp x pp x cp x tp at once, on real ranks: a composition, like ``combined``.

* ``corpus``: ``TrainingConfig`` (sizes, batch, AdamW, dtype; the global-batch accounting) and
  ``MarkovCorpus``, the seeded sparse Markov chain the model learns (``ln V`` down towards its entropy).
* ``reference``: the toy language model in one process (``init_weights``, ``token_losses``) and
  ``train_reference``, the run every layout is checked against.
* ``step``: the mechanism, ``TrainingStep``: TP with SP, vocabulary-parallel head and loss, CP ring
  attention, 1F1B across stages, DDP or ZeRO-1/2/3 over ``dp x cp``.
* ``ranks``: ``training_on_rank``, the step with its ledger measured (``LedgerProbe``).
* ``drivers``: ``check_training`` and ``run_training`` (a layout on a warm pool, as a ``TrainingRun``).
* ``machines``: ``training_across_on_rank``, the step under ``torchrun`` with tp inside machines.
* ``predict``: every rank's ledger and traffic per mesh axis, predicted (``predict_ledger``, ``predict_traffic``).
* ``time_model``: the toy's step in the training planner's time model; Spearman's rank correlation.
* ``step_time``: step time per layout, predicted on a toy cluster fitted on the ranks, and measured.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "corpus": ("TrainingConfig", "MarkovCorpus"),
    "reference": ("init_weights", "token_losses", "train_reference", "ReferenceRun"),
    "step": ("TrainingStep", "StageModel", "GroupView"),
    "ranks": ("training_on_rank", "LedgerProbe"),
    "drivers": ("check_training", "run_training", "TrainingRun"),
    "machines": ("training_across_on_rank",),
    "predict": ("predict_ledger", "predict_traffic", "activation_bytes", "format_ledger"),
    "time_model": ("LAYOUTS_4", "STEP_TIME_CONFIG", "predict_step", "spearman"),
    "step_time": ("run_step_time_check", "claim_ranking", "fit_step_cluster", "StepTimeCheck"),
})
