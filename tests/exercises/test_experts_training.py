"""The auxiliary-loss-free bias exercise: the right answer passes on 2 and 4 ranks, a blank is "not written
yet" without reaching the ranks, and each likely mistake fails with the hint that names it."""

import pytest
import torch

from shardlib.exercises.experts import grade_aux_free_bias
from shardlib.exercises.result import NOT_RIGHT, NOT_WRITTEN


def right(ctx, scores, bias, k, rate):
    experts = torch.topk(scores + bias, k, dim=-1).indices  # choose with the bias
    chosen = scores.gather(1, experts)  # weigh without it
    gates = chosen / chosen.sum(dim=-1, keepdim=True)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1])
    ctx.comm.all_reduce(counts)  # the whole step's load
    mean = counts.double().mean()
    return experts, gates, bias + rate * torch.sign(mean - counts.double())


def blank(ctx, scores, bias, k, rate):
    raise NotImplementedError


def no_bias_in_choice(ctx, scores, bias, k, rate):
    experts = torch.topk(scores, k, dim=-1).indices
    chosen = scores.gather(1, experts)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1])
    ctx.comm.all_reduce(counts)
    return experts, chosen / chosen.sum(-1, keepdim=True), bias + rate * torch.sign(counts.double().mean() - counts)


def bias_in_gates(ctx, scores, bias, k, rate):
    experts, _, new_bias = right(ctx, scores, bias, k, rate)
    chosen = (scores + bias).gather(1, experts)
    return experts, chosen / chosen.sum(dim=-1, keepdim=True), new_bias


def sign_flipped(ctx, scores, bias, k, rate):
    experts, gates, new_bias = right(ctx, scores, bias, k, rate)
    return experts, gates, 2 * bias - new_bias


def counts_not_summed(ctx, scores, bias, k, rate):
    experts = torch.topk(scores + bias, k, dim=-1).indices
    chosen = scores.gather(1, experts)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1]).double()
    return experts, chosen / chosen.sum(-1, keepdim=True), bias + rate * torch.sign(counts.mean() - counts)


def no_sign(ctx, scores, bias, k, rate):
    experts, gates, _ = right(ctx, scores, bias, k, rate)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1])
    ctx.comm.all_reduce(counts)
    return experts, gates, bias + rate * (counts.double().mean() - counts.double())


def test_the_right_answer_passes_on_2_and_4_ranks(pool2, pool4):
    result = grade_aux_free_bias(right, pool2, pool4)
    assert result.passed, result.messages
    assert "2 ranks and 4 ranks, 3 steps each" in result.checked


def test_a_blank_is_not_written_yet(pool2):
    assert grade_aux_free_bias(blank, pool2).status == NOT_WRITTEN


@pytest.mark.parametrize("wrong, phrase", [
    (no_bias_in_choice, "you chose by the scores alone"),
    (bias_in_gates, "your gates use the bias"),
    (sign_flipped, "the sign is flipped"),
    (counts_not_summed, "the counts were not summed over the ranks"),
    (no_sign, "the update uses the load difference itself"),
])
def test_each_mistake_is_named(pool2, pool4, wrong, phrase):
    result = grade_aux_free_bias(wrong, pool2, pool4)
    assert result.status == NOT_RIGHT
    assert phrase in result.messages[0], result.messages
    assert result.messages[0].startswith("2 ranks, step 1")


def test_the_grader_needs_a_pool_and_a_function():
    with pytest.raises(ValueError, match="needs at least one Ranks pool"):
        grade_aux_free_bias(right)
    with pytest.raises(ValueError, match="pass your function itself"):
        grade_aux_free_bias("right")


def test_the_instructors_answer_passes(pool2):
    from solutions_module import answers

    assert grade_aux_free_bias(answers.aux_free_route, pool2).passed
