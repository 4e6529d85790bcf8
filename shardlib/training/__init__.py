"""Training at scale: one language model trained over dp x pp x cp x tp on real ranks, and the
training planner for real clusters.

On ranks:

* ``corpus``: ``TrainingConfig`` (sizes, batch, AdamW, dtype; the global-batch accounting) and
  ``MarkovCorpus``, the seeded sparse Markov chain the model learns (``ln V`` down towards its entropy).
* ``reference``: the toy language model in one process (``init_weights``, ``token_losses``) and
  ``train_reference``, the run every layout is checked against.
* ``step``: ``TrainingStep``, the course's mechanisms composed: TP with SP, vocabulary-parallel head and
  loss, CP ring attention, the pipeline engine running any schedule of the registry on ``StageModel``
  chunks, DDP or ZeRO-1/2 (``data_parallel.buckets``) or ZeRO-3 (``data_parallel.zero3``) over ``dp x cp``.
* ``moe_block``: ``MoEBlock``, a block whose MLP is the dropless MoE layer over ``ep`` ranks of a stage.
* ``ranks``: ``training_on_rank``, the step with its ledger measured (``LedgerProbe``).
* ``drivers``: ``check_training`` and ``run_training`` (a layout on a warm pool, as a ``TrainingRun``).
* ``machines``: ``training_across_on_rank``, the step under ``torchrun`` with tp inside machines.
* ``predict``: every rank's ledger and traffic per mesh axis, predicted (``predict_ledger``, ``predict_traffic``).
* ``step_time``: step time per layout, predicted on a toy cluster fitted on the ranks, and measured.

Pure (no ranks):

* ``memory``: one training GPU's weights, gradients, optimizer state and activations, per pipeline stage.
* ``published``: published memory figures (ZeRO, Megatron-LM, DeepSpeed, Korthikanti) beside ours.
* ``time_model``: ``TrainingWorkload``; one training step's time term by term (compute, bubble, tp, cp,
  dp, pp), for real clusters and for the toy alike.
* ``toy_prediction``: the toy's layouts and global batch in that time model; Spearman's rank correlation.
* ``planner``: ``plan_training``, every (tp, pp, dp, cp, ZeRO stage) pruned, rejected or ranked by tokens/s.
* ``choices``: its choices for Llama 3 8B, 70B, 405B beside the Llama 3 paper's layouts.
* ``moe_choices``: its choice for DeepSeek-V3 on 2,048 H800s beside the published layout (PP 16 x EP 64, ZeRO-1).
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "corpus": ("TrainingConfig", "MarkovCorpus"),
    "reference": ("init_weights", "token_losses", "forward", "Forward", "train_reference", "ReferenceRun"),
    "step": ("TrainingStep", "StageModel"),
    "moe_block": ("MoEBlock", "MoEMLP", "AttachAuxLoss"),
    "ranks": ("training_on_rank", "TrainingRankResult", "LedgerProbe"),
    "drivers": ("check_training", "run_training", "TrainingRun"),
    "machines": ("training_across_on_rank",),
    "predict": ("predict_ledger", "predict_traffic", "activation_bytes", "format_ledger"),
    "toy_prediction": ("LAYOUTS_4", "STEP_TIME_CONFIG", "predict_step", "spearman"),
    "step_time": ("run_step_time_check", "claim_ranking", "run_ranking_check", "fit_step_cluster", "StepTimeCheck"),
    "memory": ("TrainingMemory", "stage_params", "in_flight", "training_memory", "peak_training_memory",
               "check_expert_layout", "expert_dp", "stage_expert_params"),
    "published": ("FigureRow", "zero_figure_rows", "megatron_rows", "deepspeed_zero3_estimate", "deepspeed_rows",
                  "activation_rows", "published_rows", "format_rows"),
    "time_model": ("TrainingWorkload", "TrainingScore", "model_flops_per_token", "axis_links", "score_training",
                   "ep_all_to_all_s"),
    "planner": ("TrainingPlan", "plan_training", "best_configuration", "format_training_plan", "expert_degrees"),
    "choices": ("PublishedLayout", "LLAMA_3_PUBLISHED", "ChoiceRow", "training_choices", "format_training_choices"),
    "moe_choices": ("PublishedMoELayout", "DEEPSEEK_V3_PUBLISHED", "MoEChoiceRow", "deepseek_v3_choices",
                    "format_deepseek_v3_choices"),
})
