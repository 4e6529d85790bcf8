"""``lab.harness``: a function run on every rank, repeated, and read back: values, comm log, spans, times."""

import statistics
from dataclasses import dataclass

import pytest
import torch

from shardlib.lab.harness import Measured, on_ranks


@dataclass(frozen=True)
class Result:
    rows: int
    out: torch.Tensor
    times_s: list


RESULTS = [Result(3, torch.tensor([[1.0, 2.0]]), [0.3, 0.1, 0.2]), None,
           Result(5, torch.tensor([[4.0, 8.0]]), [0.5, 0.9, 0.4])]


def test_each_sum_first_in_rank_order_without_absent_ranks():
    got = Measured.of(RESULTS)
    assert len(got) == 2 and got.ranks == (0, 2)
    assert got.each("rows") == (3, 5)
    assert got.sum("rows") == 8
    assert got.first("rows") == 3
    assert got.each("times_s", statistics.median) == (0.2, 0.5)
    assert got.across("times_s", max) == (0.5, 0.9, 0.4)


def test_tensors_cat_and_sum_and_gap():
    got = Measured.of(RESULTS)
    assert torch.equal(got.cat("out"), torch.tensor([[1.0, 2.0], [4.0, 8.0]]))
    assert torch.equal(got.cat("out", dim=1), torch.tensor([[1.0, 2.0, 4.0, 8.0]]))
    assert torch.equal(got.sum("out"), torch.tensor([[5.0, 10.0]]))
    assert got.max_gap("out", torch.tensor([[1.0, 2.0]])) == 6.0


def test_dicts_and_plain_values_are_read_too():
    assert Measured.of([{"a": 1}, {"a": 2}]).each("a") == (1, 2)
    assert Measured.of([3, 4]).sum() == 7


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="has no field 'row'.*rows, out, times_s"):
        Measured.of(RESULTS).each("row")
    with pytest.raises(ValueError, match="returned no 'b'; they returned a"):
        Measured.of([{"a": 1}]).each("b")
    with pytest.raises(ValueError, match="no rank returned"):
        Measured.of([None, None]).first("rows")
    assert Measured.of([None]).sum("rows") == 0


def _reduce_twice(ctx, n: int):
    with ctx.timeline.span("work", rank_twice=2 * ctx.rank):
        ctx.comm.all_reduce(torch.ones(n))
        ctx.comm.all_reduce(torch.ones(2 * n))
    return {"rank": ctx.rank, "out": torch.full((1, 2), float(ctx.rank))}


def test_on_ranks_reads_each_repeat_on_its_own(pool2):
    got = on_ranks(pool2, _reduce_twice, 4, repeats=3)
    assert got.each("rank") == (0, 1) and got.ranks == (0, 1)
    assert torch.equal(got.cat("out"), torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
    assert [len(per_rank) for per_rank in got.each_repeat("rank")] == [3, 3]
    # the harness's barriers are not logged: each repeat holds this function's two all-reduces per rank
    for repeat in (0, 1, 2):
        assert got.count(repeat=repeat) == 4
        assert got.bytes("all_reduce", repeat=repeat) == 2 * (4 + 8) * 4
    assert got.count(repeat=None) == 12
    assert got.bytes("all_reduce", rank=1) == (4 + 8) * 4
    assert got.bytes("all_reduce", rank=1, wire=True) == (4 + 8) * 4  # 2(n-1)/n = 1 on two ranks
    assert sorted(s.attrs["rank_twice"] for s in got.spans("work")) == [0, 2]
    assert len(got.spans("work", rank=0, repeat=None)) == 3
    (work,) = got.spans("work", rank=1)
    assert [r.size_bytes for r in got.within(work)] == [4 * 4, 8 * 4]  # rank 1's two calls, in that span only
    steps, elapsed = got.step_s(), got.elapsed_s(0)
    assert len(steps) == 3 and len(elapsed) == 3
    assert all(step >= e > 0 for step, e in zip(steps, elapsed))


def test_ranks_that_take_no_part_are_dropped(pool2):
    got = on_ranks(pool2, lambda ctx: ctx.rank if ctx.rank == 1 else None)
    assert got.values == (1,) and got.ranks == (1,)


def test_repeats_must_be_a_whole_number(pool2):
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="repeats must be a whole number"):
            on_ranks(pool2, lambda ctx: None, repeats=bad)
