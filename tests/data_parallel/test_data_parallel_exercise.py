"""The ZeRO-1 exercise: the solution passes on 2 and 4 ranks, a blank starter is "not written yet"
without touching the ranks, and each typical wrong answer fails with a message naming the mistake."""

import sys

import cloudpickle
import pytest
import torch
from solutions_module import ROOT, answers

from shardlib import Ranks
from shardlib.exercises import NOT_RIGHT, NOT_WRITTEN, grade_zero1_step, zero1_inputs, zero1_reference

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # and the wrong answers below


def blank(ctx, params, grads, lr):
    raise NotImplementedError("write this function")


def _adamw(weights, grad, lr):
    weights = weights.clone().requires_grad_()
    weights.grad = grad
    torch.optim.AdamW([weights], lr=lr).step()
    return weights.detach()


def averaged(ctx, params, grads, lr):
    return answers.zero1_step(ctx, params, grads / ctx.world_size, lr)


def own_shard_only(ctx, params, grads, lr):
    n, r = ctx.world_size, ctx.rank
    shard = _adamw(params.chunk(n)[r], ctx.comm.reduce_scatter(grads), lr)
    out = params.clone()
    out.chunk(n)[r].copy_(shard)
    return out


def one_shard_returned(ctx, params, grads, lr):
    return answers.zero1_step(ctx, params, grads, lr).chunk(ctx.world_size)[ctx.rank]


def all_reduce_everything(ctx, params, grads, lr):
    return _adamw(params, ctx.comm.all_reduce(grads.clone()), lr)


def neighbours_weights(ctx, params, grads, lr):
    n, r = ctx.world_size, ctx.rank
    return ctx.comm.all_gather(_adamw(params.chunk(n)[(r + 1) % n], ctx.comm.reduce_scatter(grads), lr))


def only_rank_0_reduces(ctx, params, grads, lr):
    if ctx.rank == 0:
        ctx.comm.reduce_scatter(grads)
    return params


def test_solution_passes_on_2_and_4_ranks(pool2, pool4):
    result = grade_zero1_step(answers.zero1_step, pool2, pool4)
    assert result.passed, str(result)


def test_blank_is_not_written_without_touching_the_ranks(pool2):
    before = pool2.pids
    assert grade_zero1_step(blank, pool2).status == NOT_WRITTEN
    assert pool2.pids == before


@pytest.mark.parametrize("wrong, phrases", [
    (averaged, ("rank 0", "averaged over the ranks", "their sum")),
    (own_shard_only, ("only this rank's own shard changed", "all-gather")),
    (one_shard_returned, ("12 values, one shard",)),
    (all_reduce_everything, ("the right numbers", "all_reduce", "reduce_scatter")),
    (neighbours_weights, ("weights chunk 1 updated with gradient chunk 0",)),
])
def test_wrong_answers_fail_with_a_hint(pool2, wrong, phrases):
    result = grade_zero1_step(wrong, pool2)
    assert result.status == NOT_RIGHT, str(result)
    text = " ".join(result.messages)
    assert "2 ranks" in text and all(p in text for p in phrases), text


def test_a_step_that_hangs_is_reported_not_stuck():
    with Ranks(2, timeout=5) as short:
        result = grade_zero1_step(only_rank_0_reduces, short)
        assert result.status == NOT_RIGHT and "never finished" in result.messages[0]
        assert short.run(lambda ctx: ctx.rank) == [0, 1]


def test_the_inputs_make_a_mean_distinguishable_from_a_sum():
    inputs = zero1_inputs(2)
    summed = zero1_reference(inputs["params"], inputs["grads"], inputs["lr"])
    mean = zero1_reference(inputs["params"], inputs["grads"], inputs["lr"], combine="mean")
    assert float((summed - mean).abs().max()) > 100 * 1e-6  # far beyond the grader's tolerance


def test_grader_needs_a_function_and_a_pool(pool2):
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_zero1_step(42, pool2)
    with pytest.raises(ValueError, match="at least one Ranks pool"):
        grade_zero1_step(answers.zero1_step)


def test_starter_is_blank_and_the_solution_notebook_grades_the_answer():
    starter = (ROOT / "notebooks" / "exercises" / "08_data_parallel_exercises.py").read_text()
    solution = (ROOT / "solutions" / "08_data_parallel_solutions.py").read_text()
    assert starter.count('raise NotImplementedError("write') == 1 and "grade_zero1_step(zero1_step" in starter
    assert "exercise_answers" not in starter
    assert "grade_zero1_step(answers.zero1_step" in solution
