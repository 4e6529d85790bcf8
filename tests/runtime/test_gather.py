"""``lab.gather``: per-rank dataclasses read field by field, in rank order, the absent ranks dropped."""

import statistics
from dataclasses import dataclass

import pytest
import torch

from shardlib.lab.gather import gather


@dataclass(frozen=True)
class Result:
    rows: int
    out: torch.Tensor
    times_s: list


RESULTS = [Result(3, torch.tensor([[1.0, 2.0]]), [0.3, 0.1, 0.2]), None,
           Result(5, torch.tensor([[4.0, 8.0]]), [0.5, 0.9, 0.4])]


def test_each_sum_first_in_rank_order_without_absent_ranks():
    got = gather(RESULTS)
    assert len(got) == 2
    assert got.each("rows") == (3, 5)
    assert got.sum("rows") == 8
    assert got.first("rows") == 3
    assert got.each("times_s", statistics.median) == (0.2, 0.5)
    assert got.each("times_s", min) == (0.1, 0.4)


def test_tensors_cat_and_sum_and_gap():
    got = gather(RESULTS)
    assert torch.equal(got.cat("out"), torch.tensor([[1.0, 2.0], [4.0, 8.0]]))
    assert torch.equal(got.cat("out", dim=1), torch.tensor([[1.0, 2.0, 4.0, 8.0]]))
    assert torch.equal(got.sum("out"), torch.tensor([[5.0, 10.0]]))
    assert got.max_gap("out", torch.tensor([[1.0, 2.0]])) == 6.0


def test_across_reduces_each_repeat_over_the_ranks():
    got = gather(RESULTS)
    assert got.across("times_s", max) == (0.5, 0.9, 0.4)
    assert got.across("times_s", min) == (0.3, 0.1, 0.2)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="has no field 'row'.*rows, out, times_s"):
        gather(RESULTS).each("row")
    with pytest.raises(ValueError, match="dataclasses; got dict"):
        gather([{"rows": 1}])
    with pytest.raises(ValueError, match="no rank returned"):
        gather([None, None]).first("rows")
    assert gather([None]).sum("rows") == 0


def test_on_a_pool(pool2):
    @dataclass(frozen=True)
    class Mine:
        rank: int

    assert gather(pool2.run(lambda ctx: Mine(ctx.rank))).each("rank") == (0, 1)
