"""``core.collectives.ring_all_reduce`` against ``dist.all_reduce``, and its bytes against the alpha-beta model.

Exact: the tensors hold integers (as float32, well under 2**24), so the sum is the same in any order.
"""

import pytest
import torch

from shardlib.core.collectives import ring_all_reduce
from shardlib.lab.harness import on_ranks
from shardlib.predict.alpha_beta import cost_terms


def both_all_reduces_on_rank(ctx, shape):
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) * (ctx.rank + 1) - 7
    ring = ring_all_reduce(ctx, x)
    ctx.comm.all_reduce(x)  # in place: the library's sum
    return {"ring": ring, "library": x}


@pytest.mark.parametrize("shape", [(4, 6), (5, 3)], ids=["even", "uneven"])
def test_ring_all_reduce_equals_dist_all_reduce(pool, shape):
    got = on_ranks(pool, both_all_reduces_on_rank, shape)
    n = pool.world_size
    expected = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).view(shape) * n * (n + 1) / 2 - 7 * n
    for value in got.values:
        assert torch.equal(value["ring"], value["library"]) and torch.equal(value["ring"], expected)


def test_ring_all_reduce_sends_what_the_alpha_beta_model_counts(pool):
    got = on_ranks(pool, both_all_reduces_on_rank, (8, 12))
    n, size_bytes = pool.world_size, 8 * 12 * 4
    steps, factor = cost_terms("all_reduce", n)
    for rank in range(n):
        assert got.count("send", rank) == steps == 2 * (n - 1)
        assert got.bytes("send", rank) == factor * size_bytes


def test_ring_all_reduce_on_one_rank_is_a_copy():
    x = torch.arange(6.0)
    out = ring_all_reduce(None, x)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()
