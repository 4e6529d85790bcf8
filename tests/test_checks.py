"""``checks.near_equal_parts``: the one split of a count into parts that differ by at most one."""

import pytest
import torch

from shardlib.core.checks import near_equal_parts


@pytest.mark.parametrize("n, k", [(0, 1), (1, 1), (7, 3), (8, 4), (126, 16), (3, 5), (10, 10)])
def test_parts_add_up_differ_by_one_and_match_tensor_split(n, k):
    parts = near_equal_parts(n, k)
    assert len(parts) == k and sum(parts) == n and max(parts) - min(parts) <= 1
    assert list(parts) == sorted(parts, reverse=True)  # the earlier parts take the extra
    assert parts == tuple(len(t) for t in torch.tensor_split(torch.arange(n), k))


def test_by_hand():
    assert near_equal_parts(7, 3) == (3, 2, 2)
    assert near_equal_parts(2, 4) == (1, 1, 0, 0)


@pytest.mark.parametrize("n, k, words", [(-1, 2, "the number to split must be a whole number of at least 0"),
                                         (4, 0, "the number of parts must be a whole number of at least 1"),
                                         (4, True, "the number of parts must be a whole number")])
def test_bad_input_names_the_numbers(n, k, words):
    with pytest.raises(ValueError, match=words):
        near_equal_parts(n, k)
