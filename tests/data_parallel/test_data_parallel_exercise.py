"""The ZeRO-1 exercise: the solution passes on 2 and 4 ranks, a blank starter is "not written yet"
without touching the ranks, and each typical wrong answer fails with a message naming the mistake."""

import sys

import cloudpickle
import pytest
import torch
from solutions_module import ROOT, answers

from shardlib.exercises.data_parallel import (
    ShardOptimizer,
    adamw_first_step,
    grade_zero1_step,
    zero1_inputs,
    zero1_reference,
)
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN
from shardlib.runtime.ranks import Ranks

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # and the wrong answers below


def blank(ctx, params, grads, optimizer):
    raise NotImplementedError("write this function")


def averaged(ctx, params, grads, optimizer):
    return answers.zero1_step(ctx, params, grads / ctx.world_size, optimizer)


def own_shard_only(ctx, params, grads, optimizer):
    n, r = ctx.world_size, ctx.rank
    shard = optimizer(params.chunk(n)[r], ctx.comm.reduce_scatter(grads))
    out = params.clone()
    out.chunk(n)[r].copy_(shard)
    return out


def one_shard_returned(ctx, params, grads, optimizer):
    return answers.zero1_step(ctx, params, grads, optimizer).chunk(ctx.world_size)[ctx.rank]


def all_reduce_then_shard(ctx, params, grads, optimizer):
    n, r = ctx.world_size, ctx.rank
    summed = ctx.comm.all_reduce(grads.clone())
    return ctx.comm.all_gather(optimizer(params.chunk(n)[r], summed.chunk(n)[r]))


def ddp_step(ctx, params, grads, optimizer):
    return optimizer(params, ctx.comm.all_reduce(grads.clone()))


def neighbours_weights(ctx, params, grads, optimizer):
    n, r = ctx.world_size, ctx.rank
    return ctx.comm.all_gather(optimizer(params.chunk(n)[(r + 1) % n], ctx.comm.reduce_scatter(grads)))


def around_the_log(ctx, params, grads, optimizer):
    import torch.distributed as dist

    n, r = ctx.world_size, ctx.rank
    summed = grads.clone()
    dist.all_reduce(summed)
    mine = optimizer(params.chunk(n)[r], summed.chunk(n)[r])
    parts = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(parts, mine)
    return torch.cat(parts)


def stepped_twice(ctx, params, grads, optimizer):
    n, r = ctx.world_size, ctx.rank
    mine = optimizer(params.chunk(n)[r], ctx.comm.reduce_scatter(grads))
    return ctx.comm.all_gather(optimizer(mine, torch.zeros_like(mine)))


def no_optimizer(ctx, params, grads, optimizer):
    return adamw_first_step(params, ctx.comm.all_reduce(grads.clone()), 0.01)


def only_rank_0_reduces(ctx, params, grads, optimizer):
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
    (own_shard_only, ("only this rank's own shard changed", "never reached it", "different weights")),
    (one_shard_returned, ("12 values, one shard", "travel to every rank")),
    (all_reduce_then_shard, ("the right numbers", "all_reduce", "reduce-scatter", "DDP's all-reduce", "sends 96")),
    (ddp_step, ("raised ValueError", "AdamW state for 12 values", "only its shard")),
    (neighbours_weights, ("weights chunk 1 updated with gradient chunk 0", "which chunk")),
    (around_the_log, ("comm log is empty", "ctx.comm")),
    (stepped_twice, ("already stepped once",)),
    (no_optimizer, ("never called its optimizer",)),
])
def test_wrong_answers_fail_with_a_hint(pool2, wrong, phrases):
    result = grade_zero1_step(wrong, pool2)
    assert result.status == NOT_RIGHT, str(result)
    text = " ".join(result.messages)
    assert "2 ranks" in text and all(p in text for p in phrases), text


def test_a_step_that_hangs_is_reported_not_stuck():
    with Ranks(2, timeout=2.5) as short:
        result = grade_zero1_step(only_rank_0_reduces, short)
        assert result.status == NOT_RIGHT and "never finished" in result.messages[0]
        assert short.run(lambda ctx: ctx.rank) == [0, 1]


def test_the_inputs_make_a_mean_distinguishable_from_a_sum():
    inputs = zero1_inputs(2)
    summed = zero1_reference(inputs["params"], inputs["grads"], inputs["lr"])
    mean = zero1_reference(inputs["params"], inputs["grads"], inputs["lr"], combine="mean")
    assert float((summed - mean).abs().max()) > 100 * 1e-6  # far beyond the grader's tolerance


def test_the_written_out_adamw_is_torchs_first_step():
    g = torch.Generator().manual_seed(3)
    weights, grad = torch.randn(40, generator=g), torch.randn(40, generator=g) * 10.0 ** torch.randint(-10, 1, (40,))
    theirs = weights.clone().requires_grad_()
    theirs.grad = grad.clone()
    torch.optim.AdamW([theirs], lr=0.01).step()
    assert torch.allclose(adamw_first_step(weights, grad, 0.01), theirs.detach(), rtol=0, atol=1e-7)


def test_the_shard_optimizer_refuses_more_than_its_shard_and_a_second_step():
    opt = ShardOptimizer(4)
    with pytest.raises(ValueError, match="keeps AdamW state for 4 values"):
        opt(torch.zeros(8), torch.zeros(8))
    assert opt.steps == []
    opt(torch.zeros(4), torch.ones(4))
    assert opt.steps == [4]
    with pytest.raises(ValueError, match="already stepped once"):
        opt(torch.zeros(4), torch.ones(4))
    with pytest.raises(ValueError, match="capacity of at least 1"):
        ShardOptimizer(0)


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
    code = "\n".join(line for line in starter.splitlines() if not line.startswith("#"))
    assert "reduce_scatter" not in code and "all_gather" not in code  # the design is the learner's
    assert "grade_zero1_step(answers.zero1_step" in solution
