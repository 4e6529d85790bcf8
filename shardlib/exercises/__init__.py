"""Exercises that check themselves: the learner writes a function, a grader compares it with the reference.

* ``tensor_parallel``: ``grade_shard_rows``, ``grade_tp_pair_forward`` (split a weight; a pair on ranks).
* ``costs``: ``grade_fit_alpha_beta`` (fit a latency and a bandwidth to a sweep).
* ``pipeline``: ``grade_one_f_one_b`` (one stage's 1F1B order, played out with the others; on ranks), and
  ``grade_bubble_fraction`` (the bubble, both conventions, off-by-ones told apart).
* ``pipeline_schedules``: ``grade_small_table``, ``grade_schedule_table`` (a schedule as a table of F, B, W, by hand at
  2 stages and 2 microbatches, then for any size; run on ranks).
* ``experts``: ``grade_top_k_router``, ``grade_dispatch_plan`` (a router; where each slot goes).
* ``experts_training``: ``grade_aux_free_bias`` (DeepSeek-V3's balancing bias, chosen with and updated on ranks).
* ``data_parallel``: ``grade_zero1_step`` (ZeRO-1's step on ranks, and its comm log).
* ``serving``: ``grade_mesh_coordinates`` (a rank's place in the mesh, beside a ``DeviceMesh``).
* ``context_parallel``: ``grade_merge_partial_attention`` (the online softmax's merge).
* ``serving_engine``: ``grade_block_manager`` (allocate and free with prefix reuse, on traces).
* ``serving_at_scale``: ``grade_prefix_router`` (the prefix-aware router's choice with its balance threshold,
  on traces, beside the library's router), ``PrefixRouterState`` (what the learner's router starts from).
* ``training``: ``grade_training_memory`` (a training rank's bytes, against its measured ledger).
* ``training_ledger``: ``parameters_per_unit``, ``activation_bytes_per_microbatch`` (what that learner is
  given), ``kept_bytes`` (a rank's kept bytes, right or with one mistake made) and the hint naming each mistake.
* ``result``: ``ExerciseResult`` (``.passed``, ``.status``, ``.messages``), shown as a coloured report.

Graders never raise for a learner's mistake: they say what differs, where, and the likely mistake; each
grader module lists the wrong answers it names. Validators elsewhere are ``check_*``: they raise.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "result": ("ExerciseResult", "PASSED", "NOT_WRITTEN", "NOT_RIGHT"),
    "tensor_parallel": ("grade_shard_rows", "grade_tp_pair_forward", "pair_weights", "pair_reference"),
    "costs": ("grade_fit_alpha_beta",),
    "pipeline": ("grade_one_f_one_b", "grade_bubble_fraction"),
    "pipeline_schedules": ("grade_small_table", "grade_schedule_table"),
    "experts": ("grade_top_k_router", "grade_dispatch_plan"),
    "experts_training": ("grade_aux_free_bias", "bias_exercise_inputs", "library_choice"),
    "data_parallel": ("grade_zero1_step", "zero1_inputs", "zero1_reference"),
    "context_parallel": ("grade_merge_partial_attention",),
    "serving_engine": ("grade_block_manager",),
    "serving_at_scale": ("grade_prefix_router", "PrefixRouterState"),
    "serving": ("grade_mesh_coordinates", "reference_groups", "groups_met_on_rank", "GroupsMet"),
    "training": ("grade_training_memory",),
    "training_ledger": ("parameters_per_unit", "activation_bytes_per_microbatch", "kept_bytes"),
})
