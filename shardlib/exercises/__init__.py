"""Exercises that check themselves: the learner writes a function, a grader compares it with the reference.

| exercise | the learner writes | grader (reference) | wrong answers it names |
| --- | --- | --- | --- |
| split a weight by rows | ``shard_rows(weight, n_shards)`` | ``grade_shard_rows`` (``tensor_parallel.shard_rows`` at 2, 3, 4, 8 shards) | rows and columns swapped; an uneven (off-by-one) split; shards shifted by one; a transposed shard; no ``ValueError`` when the count does not divide |
| a column-then-row pair on ranks | ``pair_fn(ctx, x, w1, b1, w2, b2)`` | ``grade_tp_pair_forward`` (the unsharded pair, on ``Ranks(2)`` and ``Ranks(4)``, and the comm log) | a missing all-reduce; the bias added before the sum; rows and columns swapped; no communication (each rank computes everything); a slice returned; a collective only some ranks call (reported, not hung) |
| fit latency and bandwidth | ``fit_alpha_beta(sizes_bytes, times_s)`` | ``grade_fit_alpha_beta`` (known latency and bandwidth on synthetic sweeps, exact and noisy, three scales, some unsorted; then ``costs.calibration.fit_link`` on a live point-to-point sweep) | the slope returned for the bandwidth; the smallest message's time taken as the latency; no intercept; plain least squares (a negative or noise-made latency); milliseconds or GB/s for seconds and bytes per second; the two numbers swapped |
| the pipeline bubble | ``bubble_fraction(n_stages, n_microbatches)`` | ``grade_bubble_fraction`` (``pipeline.pipeline_bubble_fraction``) | the ratio-to-ideal convention ``(p-1)/m``; the busy fraction; off-by-ones ``(p-1)/(m+p)`` and ``p/(m+p-1)``; integer division; no ``ValueError`` for 0 stages or microbatches |
| a top-k router | ``top_k_router(x, router, k)`` | ``grade_top_k_router`` (``experts.route``) | gates not renormalised; the lowest scores picked; raw logits as gates; transposed outputs |
| a dispatch plan | ``plan_dispatch(experts, n_experts, ep)`` | ``grade_dispatch_plan`` (``experts.dispatch_plan`` at 2, 4, 8 ranks) | a lost slot; a duplicated slot; experts placed by ``e % ep``; rows not grouped by expert; wrong per-rank counts |
| ZeRO-1's step on ranks | ``zero1_step(ctx, params, grads, lr)`` | ``grade_zero1_step`` (one AdamW step on the summed gradient, on ``Ranks(2)`` and ``Ranks(4)``, and the comm log) | gradients averaged, not summed; only the own shard updated (no all-gather); one shard returned; another rank's shard updated; an all-reduce instead of a reduce-scatter; a collective only some ranks call |
| a rank's place in the mesh | ``coordinates(rank, tp, pp, dp)``, ``groups(rank, tp, pp, dp)`` | ``grade_mesh_coordinates`` (``plan.Layout`` on 11 layouts of 2 to 32 ranks; the groups built on ``Ranks(4)`` beside a ``DeviceMesh``) | stages or replicas numbered fastest; replicas outermost; coordinates in another order; a group without its own rank; another axis's group; members at the wrong stride |
| merge two partial attention results | ``merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)`` | ``grade_merge_partial_attention`` (``context_parallel.merge``, and attention over all the keys) | a plain average; outputs weighed by their sums without rescaling to the new max; no division by the new sum; exponentiating the maxes (overflow at scores near 1000); a wrong max or sum |

Graders are named ``grade_*`` (validators elsewhere are ``check_*``: they raise, graders report). Each
grader returns an ``ExerciseResult`` (``.passed``, ``.status``, ``.messages``) that displays as a
short coloured report in a notebook. A function whose body still raises ``NotImplementedError`` is
"not written yet"; a wrong answer gets messages saying what differs, where (shard count, shard, rank,
token) and the likely mistake. Graders never raise for a learner's mistake. The package is split by
strategy so each grader reads in one sitting.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "result": ("ExerciseResult", "PASSED", "NOT_WRITTEN", "NOT_RIGHT"),
    "tensor_parallel": ("grade_shard_rows", "grade_tp_pair_forward", "pair_weights", "pair_reference"),
    "costs": ("grade_fit_alpha_beta",),
    "pipeline": ("grade_bubble_fraction",),
    "experts": ("grade_top_k_router", "grade_dispatch_plan"),
    "data_parallel": ("grade_zero1_step", "zero1_inputs", "zero1_reference"),
    "context_parallel": ("grade_merge_partial_attention",),
    "plan": ("grade_mesh_coordinates", "reference_groups", "groups_met_on_rank"),
})
