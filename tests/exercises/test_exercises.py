"""The exercises' graders: every solution passes, a blank starter is "not written yet", and each
typical wrong answer fails with a message that names the mistake."""

import sys
from pathlib import Path

import cloudpickle
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from solutions_module import answers

from shardlib.core.toy import activations, stack_weights
from shardlib.exercises.bubble import grade_bubble_fraction, grade_pass_time
from shardlib.exercises.context_parallel import grade_merge_partial_attention
from shardlib.exercises.costs import grade_fit_alpha_beta
from shardlib.exercises.experts import grade_dispatch_plan, grade_top_k_router
from shardlib.exercises.pipeline import grade_one_f_one_b
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN, PASSED, ExerciseResult
from shardlib.exercises.tensor_parallel import grade_shard_rows, grade_tp_pair_forward
from shardlib.facts.models import TOY
from shardlib.runtime.ranks import Ranks

ROOT = Path(__file__).resolve().parents[2]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # and the wrong answers below


def blank(*args):
    raise NotImplementedError("write this function")


def assert_wrong(result: ExerciseResult, *phrases: str) -> None:
    """The answer fails, and the first message says what is wrong in the words given."""
    assert result.status == NOT_RIGHT and not result.passed, str(result)
    text = " ".join(result.messages)
    for phrase in phrases:
        assert phrase in text, f"{phrase!r} not in:\n{result}"


# -- the result object ---------------------------------------------------------------------------------
def test_result_displays_as_text_and_html():
    result = grade_bubble_fraction(lambda p, m: (p - 1) / m)
    html = result._repr_html_()
    assert "bubble fraction" in html and "not yet right" in html and "<li>" in html
    assert str(result).startswith("bubble fraction: not yet right")
    with pytest.raises(ValueError, match="status must be one of"):
        ExerciseResult("x", "done", (), "")


# -- shard_rows ------------------------------------------------------------------------------------------
def test_shard_rows_solution_passes_and_blank_is_not_written():
    assert grade_shard_rows(answers.shard_rows).status == PASSED
    result = grade_shard_rows(blank)
    assert result.status == NOT_WRITTEN and "NotImplementedError" in result.messages[0]


def rows_and_columns_swapped(weight, n):
    if weight.shape[0] % n:
        raise ValueError("does not divide")
    return list(weight.chunk(n, dim=0))


def uneven_split(weight, n):
    width = weight.shape[1] // n
    return [weight[:, i * width:(i + 1) * width + 1] for i in range(n)]  # one column too many


def shifted_by_one(weight, n):
    return [answers.shard_rows(weight, n)[(i + 1) % n] for i in range(n)]


def transposed(weight, n):
    return [s.T for s in answers.shard_rows(weight, n)]


def no_value_error(weight, n):
    return list(weight.chunk(n, dim=1))  # right wherever n divides, silently uneven where it does not


@pytest.mark.parametrize("wrong, phrases", [
    (rows_and_columns_swapped, ("n_shards = 2, shard 0 of 2", "wrong dimension", "rows 0..6, columns 0..24")),
    (uneven_split, ("shard 0 of 2", "13 columns", "off-by-one")),
    (shifted_by_one, ("shard 0 of 2", "holds shard 1's columns (12..24)", "shifted")),
    (transposed, ("transposed",)),
    (no_value_error, ("n_shards = 5", "should raise ValueError", "widths [5, 5, 5, 5, 4]")),
])
def test_shard_rows_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_shard_rows(wrong), *phrases)


# -- the pair on ranks ------------------------------------------------------------------------------------
def missing_all_reduce(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r]))
    return F.linear(hidden, w2.chunk(tp, 1)[r]) + b2


def bias_before_sum(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r]))
    return ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 1)[r], b2))


def pair_rows_and_columns_swapped(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, w1.chunk(tp, 1)[r], b1.chunk(tp, 0)[r]))
    return ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 0)[r])) + b2


def no_communication(ctx, x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)  # every rank does all the work


def returns_a_slice(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    return no_communication(ctx, x, w1, b1, w2, b2).chunk(tp, -1)[r]


def averaged_not_summed(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r]))
    return ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 1)[r])) / tp + b2


def gelu_after_the_sum(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r])
    return F.gelu(ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 1)[r]))) + b2


def slices_misaligned(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r]))
    return ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 1)[(r + 1) % tp])) + b2


def relu_not_gelu(ctx, x, w1, b1, w2, b2):
    tp, r = ctx.world_size, ctx.rank
    hidden = F.relu(F.linear(x, w1.chunk(tp, 0)[r], b1.chunk(tp, 0)[r]))
    return ctx.comm.all_reduce(F.linear(hidden, w2.chunk(tp, 1)[r])) + b2


def test_pair_solution_passes_on_2_and_4_ranks(pool2, pool4):
    result = grade_tp_pair_forward(answers.tp_pair_forward, pool2, pool4)
    assert result.passed, str(result)
    assert result.checked == "on 2 ranks and 4 ranks"


def test_pair_blank_is_not_written_without_touching_the_ranks(pool2):
    before = pool2.run(lambda ctx: __import__("os").getpid())
    assert grade_tp_pair_forward(blank, pool2).status == NOT_WRITTEN
    assert pool2.run(lambda ctx: __import__("os").getpid()) == before, "the pool was restarted"


@pytest.mark.parametrize("wrong, phrases", [
    (missing_all_reduce, ("rank 0", "own partial product", "all-reduce is missing")),
    (bias_before_sum, ("rank 0", "off by 1 x b2", "add it once")),
    (pair_rows_and_columns_swapped, ("2 ranks: rank", "w1 is (d_hidden, d_model) and is cut by columns")),
    (no_communication, ("rank 0", "issued no collectives", "one all_reduce")),
    (returns_a_slice, ("rank 0", "a slice of the 8 output features")),
    (averaged_not_summed, ("rank 0", "the mean of the partial products", "do not divide")),
    (gelu_after_the_sum, ("rank 0", "gelu was applied after the all-reduce")),
    (slices_misaligned, ("rank 0", "does not match its slice of w1", "the same hidden features")),
    (relu_not_gelu, ("rank 0", "no usual mistake matches", "F.gelu (not relu)", "b2 added once")),
])
def test_pair_wrong_answers_fail_with_a_hint(pool2, wrong, phrases):
    assert_wrong(grade_tp_pair_forward(wrong, pool2), "2 ranks", *phrases)


def test_pair_wrong_answer_reports_the_shard_count(pool4):
    assert_wrong(grade_tp_pair_forward(bias_before_sum, pool4), "4 ranks, rank 0", "off by 3 x b2")


def only_rank_0_reduces(ctx, x, w1, b1, w2, b2):
    if ctx.rank == 0:
        return ctx.comm.all_reduce(x.clone())
    return x


def test_pair_that_hangs_is_reported_not_stuck():
    with Ranks(2, timeout=2.5) as short:
        result = grade_tp_pair_forward(only_rank_0_reduces, short)
        assert_wrong(result, "never finished", "same collectives in the same order")
        assert short.run(lambda ctx: ctx.rank) == [0, 1]


def test_pair_needs_a_pool():
    with pytest.raises(ValueError, match="at least one Ranks pool"):
        grade_tp_pair_forward(answers.tp_pair_forward)


# -- the bubble of a served batch, and its pass's time (notebook 03's exercise) ---------------------------------
def right_bubble_fraction(n_stages, n_microbatches):
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError("a pipeline needs at least 1 stage and 1 microbatch")
    return (n_stages - 1) / (n_microbatches + n_stages - 1)


def test_bubble_solution_passes_and_blank_is_not_written():
    assert grade_bubble_fraction(right_bubble_fraction).passed
    assert grade_bubble_fraction(blank).status == NOT_WRITTEN


def checked(formula):
    def bubble(p, m):
        if p < 1 or m < 1:
            raise ValueError("at least one")
        return formula(p, m)
    return bubble


@pytest.mark.parametrize("wrong, phrases", [
    (checked(lambda p, m: (p - 1) / m), ("p = 2 stages, m = 1", "ratio of idle time to ideal compute")),
    (checked(lambda p, m: m / (m + p - 1)), ("busy fraction",)),
    (checked(lambda p, m: (p - 1) / (m + p)), ("not m + p (an off-by-one)",)),
    (checked(lambda p, m: p / (m + p - 1)), ("not p (an off-by-one)",)),
    (checked(lambda p, m: (p - 1) // (m + p - 1)), ("integer division",)),
    (lambda p, m: (p - 1) / (m + p - 1), ("p = 0, m = 4", "raise ValueError")),
])
def test_bubble_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_bubble_fraction(wrong), *phrases)


def right_pass_time(p, m, t, h):
    if p < 1 or m < 1:
        raise ValueError("a pipeline needs at least 1 stage and 1 microbatch")
    return (m + p - 1) * t + (p - 1) * h


def test_pass_time_solution_passes_and_blank_is_not_written():
    assert grade_pass_time(right_pass_time).passed
    assert grade_pass_time(blank).status == NOT_WRITTEN


def timed(formula):
    def pass_time(p, m, t, h):
        if p < 1 or m < 1:
            raise ValueError("at least one")
        return formula(p, m, t, h)
    return pass_time


@pytest.mark.parametrize("wrong, phrases", [
    (timed(lambda p, m, t, h: (m + p - 1) * t), ("p = 2, m = 1, stages of 25 ms, hops of 2 ms", "leaves the hops out")),
    (timed(lambda p, m, t, h: (m + p - 1) * (t + h)), ("charges a hop to every slot",)),
    (timed(lambda p, m, t, h: (m + p - 1) * t + p * h), ("p - 1 hops, not p",)),
    (timed(lambda p, m, t, h: p * m * t), ("stages work at the same time",)),
    (timed(lambda p, m, t, h: m * t), ("picture the first microbatch's trip",)),
    (lambda p, m, t, h: (m + p - 1) * t + (p - 1) * h, ("p = 0, m = 4", "raise ValueError")),
])
def test_pass_time_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_pass_time(wrong), *phrases)


# -- one stage's 1F1B order ----------------------------------------------------------------------------------
def _with_warmup(warmup, steady_b_first=False):
    """An order built like 1F1B's, ``warmup(s, p, m)`` forwards first (the answer uses ``p - s - 1``)."""
    def order(stage, n_stages, m):
        w = max(0, min(warmup(stage, n_stages, m), m))
        row = [("F", i) for i in range(w)]
        for k in range(m - w):
            row += [("B", k), ("F", w + k)] if steady_b_first else [("F", w + k), ("B", k)]
        return row + [("B", i) for i in range(m - w, m)]
    return order


def _gpipe(stage, n_stages, m):
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def _b0_too_early(stage, n_stages, m):
    """1F1B, but stage 1 runs B 0 before F 1: it waits for stage 2's gradient, which waits for F 1."""
    row = answers.one_f_one_b(stage, n_stages, m)
    if stage == 1 and n_stages >= 3 and m > 1:
        row.remove(("B", 0))
        row.insert(row.index(("F", 1)), ("B", 0))
    return row


def test_one_f_one_b_solution_passes_and_blank_is_not_written():
    result = grade_one_f_one_b(answers.one_f_one_b)
    assert result.passed, str(result)
    assert grade_one_f_one_b(blank).status == NOT_WRITTEN


@pytest.mark.parametrize("wrong, phrases", [
    (_gpipe, ("p = 2, m = 4: stage 0 holds 4 microbatches in flight", "1F1B holds at most 2 there")),
    (_with_warmup(lambda s, p, m: p - s), ("p = 4, m = 8: stage 0 holds 5 microbatches in flight",
                                           "1F1B holds at most 4", "Count the forwards stage 0 runs")),
    (_with_warmup(lambda s, p, m: 0), ("step takes 16 slots where 1F1B takes 2 (m + p - 1) = 10",
                                       "Check how many forwards")),
    (_with_warmup(lambda s, p, m: p - s - 1, steady_b_first=True),
     ("p = 2, m = 4: deadlock", "stage 1 waits at B0 for F0 of stage 1", "a B for its own F")),
    (_b0_too_early, ("p = 4, m = 8: deadlock", "stage 1 waits at B0 for B0 of stage 2",
                     "stage 2 waits at F1 for F1 of stage 1", "runs its list in order")),
    (lambda s, p, m: answers.one_f_one_b(s, p, m)[:-1], ("never run: stage 0 B3",)),
    (lambda s, p, m: answers.one_f_one_b(s, p, m) + [("F", 0)], ("stage 0 runs F0 twice",)),
    (lambda s, p, m: [f"F{i}" for i in range(m)], ("write each action as a pair", "got 'F0'")),
    (lambda s, p, m: answers.one_f_one_b(s, p, m) + [("B", m)], ("not part of this step", "they run 0 .. m-1")),
    (lambda s, p, m: 1 / 0, ("raised ZeroDivisionError",)),
])
def test_one_f_one_b_wrong_orders_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_one_f_one_b(wrong), *phrases)


def test_one_f_one_b_runs_on_ranks_bit_for_bit(pool2):
    layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=4)
    x, grad = activations(8, 2, TOY.d_model, seed=1), activations(8, 2, TOY.d_model, seed=2)
    result = grade_one_f_one_b(answers.one_f_one_b, pool2, TOY, layers, x, grad)
    assert result.passed and "bit for bit" in result.messages[0] and "[2, 1]" in result.messages[0], str(result)
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_one_f_one_b(42)


# -- the router -------------------------------------------------------------------------------------------
def not_renormalised(x, router, k):
    logits = x @ router.T
    experts = logits.topk(k, dim=-1).indices
    return experts, torch.softmax(logits, -1).gather(1, experts)


def lowest_scores(x, router, k):
    logits = x @ router.T
    low, experts = logits.topk(k, dim=-1, largest=False)
    return experts, torch.softmax(low, -1)


def raw_logit_gates(x, router, k):
    top, experts = (x @ router.T).topk(k, dim=-1)
    return experts, top


def router_transposed(x, router, k):
    experts, gates = answers.top_k_router(x, router, k)
    return experts.T, gates.T


def test_router_solution_passes_and_blank_is_not_written():
    assert grade_top_k_router(answers.top_k_router).passed
    assert grade_top_k_router(blank).status == NOT_WRITTEN


def test_router_accepts_any_order_within_a_token():
    def ascending(x, router, k):
        experts, gates = answers.top_k_router(x, router, k)
        return experts.flip(-1), gates.flip(-1)
    assert grade_top_k_router(ascending).passed


@pytest.mark.parametrize("wrong, phrases", [
    (not_renormalised, ("k = 2: token 0's gates", "softmax over all experts", "renormalise")),
    (lowest_scores, ("token 0 went to experts", "lowest scores")),
    (raw_logit_gates, ("raw logits",)),
    (router_transposed, ("transposed",)),
])
def test_router_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_top_k_router(wrong), *phrases)


# -- the dispatch plan ------------------------------------------------------------------------------------
def loses_a_slot(experts, n_experts, ep):
    order, rows = answers.plan_dispatch(experts, n_experts, ep)
    return order[:-1], rows


def duplicates_a_slot(experts, n_experts, ep):
    order, rows = answers.plan_dispatch(experts, n_experts, ep)
    return torch.cat([order, order[:1]]), rows


def owner_by_modulo(experts, n_experts, ep):
    flat = experts.flatten()
    owner = flat % ep
    order = torch.sort(owner * n_experts + flat, stable=True).indices
    return order, torch.bincount(owner, minlength=ep).tolist()


def token_order_within_rank(experts, n_experts, ep):
    flat = experts.flatten()
    owner = flat // (n_experts // ep)
    return torch.sort(owner, stable=True).indices, torch.bincount(owner, minlength=ep).tolist()


def wrong_counts(experts, n_experts, ep):
    order, rows = answers.plan_dispatch(experts, n_experts, ep)
    return order, [len(order)] + [0] * (ep - 1)


def test_dispatch_solution_passes_and_blank_is_not_written():
    assert grade_dispatch_plan(answers.plan_dispatch).passed
    assert grade_dispatch_plan(blank).status == NOT_WRITTEN


@pytest.mark.parametrize("wrong, phrases", [
    (loses_a_slot, ("on 2 ranks", "loses 1 of the 24 slots", "every slot goes exactly once")),
    (duplicates_a_slot, ("sends 1 slots more than once", "(2 times)")),
    (owner_by_modulo, ("contiguous blocks", "not 4 % 2 = 0")),
    (token_order_within_rank, ("in another order", "group rows by expert")),
    (wrong_counts, ("is in the block for rank 0",)),
])
def test_dispatch_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_dispatch_plan(wrong), *phrases)


# -- merging two partial attention results ----------------------------------------------------------------
def merge_average(out_a, max_a, sum_a, out_b, max_b, sum_b):
    return (out_a + out_b) / 2, torch.maximum(max_a, max_b), sum_a + sum_b


def merge_by_sums(out_a, max_a, sum_a, out_b, max_b, sum_b):
    total = (sum_a + sum_b).unsqueeze(-1)
    merged = (sum_a.unsqueeze(-1) * out_a + sum_b.unsqueeze(-1) * out_b) / total
    return merged, torch.maximum(max_a, max_b), sum_a + sum_b


def merge_not_divided(out_a, max_a, sum_a, out_b, max_b, sum_b):
    out, new_max, new_sum = answers.merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)
    return out * new_sum.unsqueeze(-1), new_max, new_sum


def merge_exponentiating_maxes(out_a, max_a, sum_a, out_b, max_b, sum_b):
    """Right for ordinary scores; exp(max) overflows once a max passes about 88."""
    new_max = torch.maximum(max_a, max_b)
    w_a, w_b = sum_a * torch.exp(max_a), sum_b * torch.exp(max_b)
    out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / (w_a + w_b).unsqueeze(-1)
    return out, new_max, (w_a + w_b) / torch.exp(new_max)


def merge_sum_not_rescaled(out_a, max_a, sum_a, out_b, max_b, sum_b):
    out, new_max, _ = answers.merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)
    return out, new_max, sum_a + sum_b


def merge_wrong_max(out_a, max_a, sum_a, out_b, max_b, sum_b):
    out, _, new_sum = answers.merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)
    return out, torch.minimum(max_a, max_b), new_sum


def merge_weights_swapped(out_a, max_a, sum_a, out_b, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    w_a, w_b = sum_a * torch.exp(max_a - new_max), sum_b * torch.exp(max_b - new_max)
    out = (w_b.unsqueeze(-1) * out_a + w_a.unsqueeze(-1) * out_b) / (w_a + w_b).unsqueeze(-1)
    return out, new_max, w_a + w_b


def merge_without_unsqueeze(out_a, max_a, sum_a, out_b, max_b, sum_b):
    new_max = torch.maximum(max_a, max_b)
    w_a, w_b = sum_a * torch.exp(max_a - new_max), sum_b * torch.exp(max_b - new_max)
    return (w_a * out_a + w_b * out_b) / (w_a + w_b), new_max, w_a + w_b


def test_merge_solution_passes_and_blank_is_not_written():
    assert grade_merge_partial_attention(answers.merge_partials).passed
    assert grade_merge_partial_attention(blank).status == NOT_WRITTEN


@pytest.mark.parametrize("wrong, phrases", [
    (merge_average, ("blocks of 5 and 7 keys (a then b)", "plain average")),
    (merge_by_sums, ("weighed each output by its sum alone", "rescale")),
    (merge_not_divided, ("not divided by the new sum",)),
    (merge_exponentiating_maxes, ("scores near 1000", "inf or nan", "Never exponentiate a max")),
    (merge_sum_not_rescaled, ("out and max are right but sum is not",)),
    (merge_wrong_max, ("max is not the largest score",)),
    (merge_weights_swapped, ("check three things", "its own block's out")),
    (merge_without_unsqueeze, ("raised RuntimeError", "Check the shapes", "unsqueeze(-1)")),
    (lambda *args: args[:2], ("return three tensors",)),
])
def test_merge_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_merge_partial_attention(wrong), *phrases)


# -- fit_alpha_beta -------------------------------------------------------------------------------------
def fit_slope_for_bandwidth(sizes, times):
    latency, bandwidth = answers.fit_alpha_beta(sizes, times)
    return latency, 1.0 / bandwidth


def fit_smallest_message(sizes, times):
    _, bandwidth = answers.fit_alpha_beta(sizes, times)
    return times[sizes.index(min(sizes))], bandwidth


def fit_first_point(sizes, times):
    _, bandwidth = answers.fit_alpha_beta(sizes, times)
    return times[0], bandwidth


def fit_through_zero(sizes, times):
    s, t = np.asarray(sizes, dtype=float), np.asarray(times, dtype=float)
    return 0.0, float((s * s).sum() / (s * t).sum())


def fit_plain(sizes, times):
    slope, intercept = np.polyfit(sizes, times, 1)
    return float(intercept), float(1.0 / slope)


def fit_plain_clamped(sizes, times):
    latency, bandwidth = fit_plain(sizes, times)
    return max(latency, 0.0), bandwidth


def fit_in_milliseconds(sizes, times):
    latency, bandwidth = answers.fit_alpha_beta(sizes, times)
    return latency * 1e3, bandwidth


def fit_in_gb_per_s(sizes, times):
    latency, bandwidth = answers.fit_alpha_beta(sizes, times)
    return latency, bandwidth / 1e9


def fit_swapped(sizes, times):
    return answers.fit_alpha_beta(sizes, times)[::-1]


def test_fit_solution_passes_and_blank_is_not_written():
    result = grade_fit_alpha_beta(answers.fit_alpha_beta)
    assert result.passed and "pass ranks=" in result.messages[0]
    assert grade_fit_alpha_beta(blank).status == NOT_WRITTEN


def test_fit_solution_passes_on_this_machines_ranks(pool2):
    result = grade_fit_alpha_beta(answers.fit_alpha_beta, pool2)
    assert result.passed, str(result)
    assert "this machine (point-to-point, ranks 0 and 1" in result.messages[0]


def test_fit_that_disagrees_with_the_library_on_the_live_sweep_is_named(pool2):
    from shardlib.exercises.costs import _live
    from shardlib.exercises.result import Collector

    def off_by_half(sizes, times):
        latency, bandwidth = answers.fit_alpha_beta(sizes, times)
        return 1.5 * latency + 1e-5, 1.5 * bandwidth

    got = Collector("fit", "live")
    _live(got, off_by_half, pool2)
    assert got.failed and "the same points should give the same line within 20%" in got.messages[0]


@pytest.mark.parametrize("wrong, phrases", [
    (fit_slope_for_bandwidth, ("this machine's scale (100 us, 2 GB/s), exact", "the bandwidth is the slope",
                               "1 / slope")),
    (fit_smallest_message, ("large messages only", "the latency is the time of the smallest message")),
    (fit_first_point, ("unsorted", "the first point handed over, and this sweep is not sorted")),
    (fit_through_zero, ("the fit has no intercept",)),
    (fit_plain, ("with 10 % noise", "latency came out negative", "that is plain least squares")),
    (fit_plain_clamped, ("with 10 % noise", "that is plain least squares")),
    (fit_in_milliseconds, ("the latency is in milliseconds",)),
    (fit_in_gb_per_s, ("the bandwidth is in GB/s",)),
    (fit_swapped, ("the two numbers are swapped",)),
    (lambda sizes, times: 1e-5, ("return two finite numbers",)),
    (lambda sizes, times: (float("nan"), 1e9), ("return two finite numbers",)),
    (lambda sizes, times: 1 / 0, ("raised ZeroDivisionError",)),
])
def test_fit_wrong_answers_fail_with_a_hint(wrong, phrases):
    assert_wrong(grade_fit_alpha_beta(wrong), *phrases)


def test_a_first_unweighted_fit_fails_and_is_told_why_in_numbers():
    """The starter leaves the weighting to the learner: plain least squares passes the exact sweeps, fails
    the noisy ones, and each message shows what the line says for the smallest and the largest message."""
    result = grade_fit_alpha_beta(fit_plain)
    assert not result.passed and all("noise" in m for m in result.messages)  # the exact sweeps passed
    for m in result.messages:
        assert "Your line gives the smallest message" in m and "where it took" in m
        assert "the slowest messages count the most" in m and "open the hint" in m
    assert "the smallest message (64 bytes) -23 us where it took 123 us" in result.messages[0]


def test_the_fit_starter_leaves_the_weighting_to_the_hint():
    import re

    source = (ROOT / "notebooks" / "exercises" / "02_communication_costs_exercises.py").read_text()
    starter = source[:source.index("grade_fit_alpha_beta(fit_alpha_beta, ranks)")]
    assert "relative" not in starter and "divide" not in starter.lower()
    hint = re.search(r"<details><summary>Hint.*?</details>", source, flags=re.S)
    assert hint and "relative" in hint.group(0) and "by that point's own `t`" in hint.group(0)


# -- the notebooks: starters blank, solutions apart, every pair in sync -----------------------------------
EXERCISE_DIRS = (ROOT / "notebooks" / "exercises", ROOT / "solutions")
NOTEBOOK_STEMS = tuple(sorted(p.name[:-len("_exercises.py")] for p in EXERCISE_DIRS[0].glob("*_exercises.py")))


def test_the_exercise_notebooks_are_found_in_the_tree():
    """Every notebook with exercises is found by its file name, none listed by hand: a new one is checked
    as soon as it exists, and a chapter's notebook without exercises is not one of them."""
    chapters = {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.py")}
    assert set(NOTEBOOK_STEMS) <= chapters and len(NOTEBOOK_STEMS) >= 8
    assert {"09_pipeline_schedules", "08_data_parallel"} <= set(NOTEBOOK_STEMS)


def test_every_exercise_has_a_starter_and_a_solution_notebook():
    import ast
    import re

    for stem in NOTEBOOK_STEMS:
        for suffix in (".py", ".ipynb"):
            assert (ROOT / "notebooks" / "exercises" / f"{stem}_exercises{suffix}").exists()
            assert (ROOT / "solutions" / f"{stem}_solutions{suffix}").exists()
    blanks = 0
    for stem in NOTEBOOK_STEMS:
        starter = (ROOT / "notebooks" / "exercises" / f"{stem}_exercises.py").read_text()
        solution = (ROOT / "solutions" / f"{stem}_solutions.py").read_text()
        graders = set(re.findall(r"\b(grade_\w+)\(", starter))
        assert graders, f"{stem}: the starter calls no grader"
        for grader in sorted(graders):  # the solution grades the reference answer with the same grader
            assert re.search(rf"\b{grader}\(answers\.\w+", solution), f"{stem}: {grader}(answers....) missing"
        count = starter.count('raise NotImplementedError("write')
        assert count >= 1, f"{stem}: each starter leaves its functions blank"
        assert "exercise_answers" not in starter, "the starters must not import the solutions"
        blanks += count
    answers_module = ast.parse((ROOT / "solutions" / "exercise_answers.py").read_text())
    answers = [n.name for n in answers_module.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
               and not n.name.startswith("_")]
    assert blanks == len(answers), (blanks, answers)  # one blank per function or class the answers define


def test_exercise_notebooks_are_in_sync_and_stored_without_outputs(tmp_path):
    import json
    import shutil
    import subprocess

    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for folder in EXERCISE_DIRS:
        sources = sorted(p for p in folder.glob("*.py") if p.stem != "exercise_answers")
        assert {p.stem for p in sources} == {p.stem for p in folder.glob("*.ipynb")}, f"unpaired in {folder}"
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        subprocess.run([sys.executable, "-m", "jupytext", "--sync", *(str(copy / p.name) for p in sources)],
                       check=True, capture_output=True, cwd=tmp_path)
        for path in sources + sorted(folder.glob("*.ipynb")):
            assert (copy / path.name).read_bytes() == path.read_bytes(), f"{path.name} is out of sync"
        for nb in folder.glob("*.ipynb"):
            cells = json.loads(nb.read_text())["cells"]
            assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code"), nb.name


@pytest.mark.parametrize("grader", [grade_shard_rows, grade_bubble_fraction, grade_pass_time, grade_top_k_router,
                                    grade_dispatch_plan, grade_merge_partial_attention, grade_fit_alpha_beta])
def test_graders_refuse_something_that_is_not_a_function(grader):
    with pytest.raises(ValueError, match="pass your function itself"):
        grader(42)


@pytest.mark.parametrize("grader", [grade_shard_rows, grade_bubble_fraction, grade_one_f_one_b, grade_top_k_router,
                                    grade_dispatch_plan, grade_merge_partial_attention, grade_fit_alpha_beta])
def test_a_function_that_returns_nothing_is_not_right(grader):
    assert_wrong(grader(lambda *args: None), "your function returned None")


def test_the_schedule_exercise_has_a_blank_starter_and_a_solution():
    starter = (ROOT / "notebooks" / "exercises" / "09_pipeline_schedules_exercises.py").read_text()
    solution = (ROOT / "solutions" / "09_pipeline_schedules_solutions.py").read_text()
    assert (ROOT / "notebooks" / "exercises" / "09_pipeline_schedules_exercises.ipynb").exists()
    assert (ROOT / "solutions" / "09_pipeline_schedules_solutions.ipynb").exists()
    assert "grade_schedule_table(my_schedule" in starter and "grade_schedule_table(answers.my_schedule" in solution
    assert "grade_small_table(small_table)" in starter and "grade_small_table(answers.small_table)" in solution
    assert "grade_one_f_one_b(one_f_one_b" in starter and "grade_one_f_one_b(answers.one_f_one_b" in solution
    assert starter.count('raise NotImplementedError("write') == 3 and "exercise_answers" not in starter


def test_the_bubble_exercise_is_notebook_03s_and_serves_forward_only():
    starter = (ROOT / "notebooks" / "exercises" / "03_pipeline_parallel_exercises.py").read_text()
    solution = (ROOT / "solutions" / "03_pipeline_parallel_solutions.py").read_text()
    assert "grade_bubble_fraction(bubble_fraction)" in starter
    assert "grade_bubble_fraction(answers.bubble_fraction)" in solution
    assert "grade_pass_time(pass_time)" in starter and "grade_pass_time(answers.pass_time)" in solution
    assert "training=False" in starter and "backward" not in starter.lower()


def test_the_schedule_grader_refuses_something_that_is_not_a_function():
    from shardlib.exercises.pipeline import grade_schedule_table
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_schedule_table(42)
