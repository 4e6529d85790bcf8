"""Grader for the context-parallel exercise: merge two partial attention results with their max and sum.

The learner writes ``merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b) -> (out, max, sum)``: two
attention results over disjoint blocks of keys, each normalised over its own block, with its rows'
largest score and the sum of ``exp(score - max)``, merged into the result over both blocks (the online
softmax of Milakov and Gimelshein 2018, the step every ring-attention rank repeats; reference:
``core.context_parallel.online_softmax.merge``). The final check is against attention over all the keys at
once, ``scaled_dot_product_attention``. A case with scores near 1000 catches a merge that exponentiates
the maxes themselves (``exp(1000)`` overflows).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.checks import TOLERANCE
from shardlib.core.context_parallel.online_softmax import Partial, block_partial, merge
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable

# (heads, queries, keys in block a, keys in block b, head_dim, score scale): the last case's scores are ~1000
CASES = ((2, 4, 5, 7, 8, 1.0), (1, 3, 6, 2, 4, 4.0), (2, 3, 4, 4, 8, 400.0))


def _case(heads, rows, keys_a, keys_b, hd, scale, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, rows, hd, generator=g) * scale ** 0.5
    k = torch.randn(1, heads, keys_a + keys_b, hd, generator=g) * scale ** 0.5
    k[:, :, keys_a:] += 0.5 * scale ** 0.5  # block b tends to score differently from block a
    v = torch.randn(1, heads, keys_a + keys_b, hd, generator=g)
    a = block_partial(q, k[:, :, :keys_a], v[:, :, :keys_a])
    b = block_partial(q, k[:, :, keys_a:], v[:, :, keys_a:])
    return a, b, F.scaled_dot_product_attention(q, k, v)


# Merges a learner is likely to write instead, each with what it gets wrong.
def _average(a, b):
    return (a.out + b.out) / 2


def _by_sums(a, b):
    return (a.row_sum.unsqueeze(-1) * a.out + b.row_sum.unsqueeze(-1) * b.out) / (a.row_sum + b.row_sum).unsqueeze(-1)


def _not_renormalised(a, b):
    m = torch.maximum(a.row_max, b.row_max)
    w_a, w_b = a.row_sum * torch.exp(a.row_max - m), b.row_sum * torch.exp(b.row_max - m)
    return w_a.unsqueeze(-1) * a.out + w_b.unsqueeze(-1) * b.out


LIKELY_MISTAKES = (
    (_average, "that is the plain average of the two outputs: each block must count in proportion to its share "
               "of the softmax's denominator, sum x exp(max)"),
    (_by_sums, "you weighed each output by its sum alone: the two sums are measured from different maxes, so "
               "first rescale each by exp(its max - the new max)"),
    (_not_renormalised, "the weights are right but the result is not divided by the new sum: each partial output "
                        "is normalised, so the merge must be too"),
)


def _hint(a: Partial, b: Partial, out: torch.Tensor) -> str:
    return grading.first_match(out, ((wrong(a, b), hint) for wrong, hint in LIKELY_MISTAKES),
                               lambda x, y: grading.close(x, y, TOLERANCE)) or (
        "check three things in turn: is your new max m the larger of max_a and max_b; is each block's weight "
        "its sum rescaled to m, sum x exp(max - m), and does each weight go with its own block's out; is the "
        "weighted sum of the outs divided by the sum of the weights")


def _check(got: Collector, where: str, answer, a: Partial, b: Partial, whole: torch.Tensor) -> None:
    tensors = isinstance(answer, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in answer)
    if not tensors or len(answer) != 3:
        got.fail(f"{where}: return three tensors (out, max, sum), got {type(answer).__name__}")
        return
    out, row_max, row_sum = answer
    want = merge(a, b)
    for name, mine, ref in (("out", out, want.out), ("max", row_max, want.row_max), ("sum", row_sum, want.row_sum)):
        if tuple(mine.shape) != tuple(ref.shape):
            got.fail(f"{where}: {name} must have shape {tuple(ref.shape)}, got {tuple(mine.shape)}")
            return
    if not torch.isfinite(out).all() or not torch.isfinite(row_sum).all():
        got.fail(f"{where}: your result holds inf or nan: the scores here are near 1000, and exp(1000) overflows. "
                 "Never exponentiate a max itself, only differences: exp(max_a - m) with m the larger max")
        return
    if not grading.close(out, whole, TOLERANCE):
        gap = float((out - whole).abs().max())
        got.fail(f"{where}: out differs from attention over all the keys by up to {gap:.3g}: {_hint(a, b, out)}")
        return
    if not grading.close(row_max, want.row_max, TOLERANCE):
        got.fail(f"{where}: out is right but max is not the largest score of the two blocks, max(max_a, max_b)",
                 "max")
    elif not grading.close(row_sum, want.row_sum, TOLERANCE, TOLERANCE):
        got.fail(f"{where}: out and max are right but sum is not: measured from the new max, it is "
                 "sum_a x exp(max_a - m) + sum_b x exp(max_b - m); the next merge needs it", "sum")


SHAPES_HINT = (". Check the shapes: max and sum are (..., rows) and out is (..., rows, head_dim), so weight an out "
               "by w.unsqueeze(-1)")


@grading.checks(out=2, max=1, sum=1)
def grade_merge_partial_attention(merge_fn) -> ExerciseResult:
    """Grade a learner's ``merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b) -> (out, max, sum)``
    on three pairs of key blocks (one with scores near 1000), in both orders, against the online
    softmax's merge and against attention over all the keys at once."""
    check_callable(merge_fn, "merge_partials")
    got = Collector("merge two partial attention results",
                    "3 pairs of key blocks (5 + 7, 6 + 2, 4 + 4 keys; scores up to ~1000), each in both orders, "
                    "against attention over all the keys", grade_merge_partial_attention.checks)
    for seed, case in enumerate(CASES):
        a, b, whole = _case(*case, seed=seed)
        for first, second, order in ((a, b, "a then b"), (b, a, "b then a")):
            where = f"blocks of {case[2]} and {case[3]} keys ({order}{', scores near 1000' if case[5] > 100 else ''})"
            answer = grading.call(got, where, merge_fn, *(t.clone() for p in (first, second)
                                                        for t in (p.out, p.row_max, p.row_sum)), hint=SHAPES_HINT)
            if answer is not None:
                _check(got, where, answer, first, second, whole)
    return got.result("equal to attention over all the keys, max and sum right, in both orders and with scores "
                      "near 1000")
