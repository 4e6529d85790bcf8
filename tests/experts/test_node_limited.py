"""Node-limited routing (DeepSeek-V3): the pure parts by hand, then the cross-node rows on 4 ranks (each an
emulated node), measured from the comm log, equal to the count from the one-process routing."""

import pytest
import torch

from shardlib.core.experts.routing import MoEConfig, limit_to_nodes, route
from shardlib.lab.experts.node_limited import (
    cross_node_rows,
    nodes_reached,
    run_node_limited,
    tokens_changed,
)


def test_nodes_are_scored_by_their_highest_scores_and_the_rest_masked():
    # 8 experts on 4 nodes (2 each); k = 2, M = 1: each node scored by its best one score
    scores = torch.tensor([[0.1, 0.2, 0.9, 0.0, 0.5, 0.6, 0.3, 0.3]], dtype=torch.float64)
    assert nodes_reached(torch.arange(8)[:, None], 8, 4).int().argmax(dim=1).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    # per node: k // M = 2 scores, (0.3, 0.9, 1.1, 0.6): node 2 wins (by its best one score node 1 would)
    limited = limit_to_nodes(scores, k=2, n_nodes=4, max_nodes=1)
    assert torch.isinf(limited[0, [0, 1, 2, 3, 6, 7]]).all() and limited[0, 4:6].tolist() == [0.5, 0.6]
    two = limit_to_nodes(scores, k=2, n_nodes=4, max_nodes=2)  # per node: 1 score: nodes 1 and 2
    assert (~torch.isinf(two[0])).nonzero().flatten().tolist() == [2, 3, 4, 5]


def test_m_equal_to_the_nodes_changes_nothing():
    cfg = MoEConfig(n_experts=8, k=2, d_model=16, d_ff=32, n_nodes=4)
    x, router = torch.randn(40, cfg.d_model, dtype=torch.float64), torch.randn(8, cfg.d_model, dtype=torch.float64)
    free = route(x, router, cfg).experts
    assert torch.equal(route(x, router, cfg.but(max_nodes=4)).experts, free)
    one = route(x, router, cfg.but(max_nodes=1)).experts
    assert int(nodes_reached(one, 8, 4).sum(dim=1).max()) == 1
    assert tokens_changed(free, free) == 0 and tokens_changed(one, free) > 0


def test_cross_node_rows_by_hand():
    experts = torch.tensor([[0, 1], [2, 5], [6, 7]])  # nodes of 2 experts: (0, 0), (1, 2), (3, 3)
    home = torch.tensor([0, 1, 2])
    assert cross_node_rows(experts, home, 8, 4) == 0 + 1 + 2
    assert cross_node_rows(experts, home, 8, 4, dedup=True) == 0 + 1 + 1


def test_a_limit_that_cannot_hold_k_experts_is_refused():
    with pytest.raises(ValueError, match="can reach only 2 experts, fewer than k = 4"):
        MoEConfig(n_experts=8, k=4, n_nodes=4, max_nodes=1)
    with pytest.raises(ValueError, match=r"max_nodes \(M, the nodes one token may reach\) must be a whole number "
                                         r"from 1 to 4, got 5"):
        MoEConfig(n_experts=8, k=2, n_nodes=4, max_nodes=5)
    with pytest.raises(ValueError, match="cannot be spread evenly over 3 nodes"):
        MoEConfig(n_experts=8, k=2, n_nodes=3)


def test_on_ranks_the_limit_bounds_the_cross_node_rows(pool4):
    run = run_node_limited(pool4, MoEConfig(n_experts=16, k=4, d_model=16, d_ff=32), max_nodes=2, n_tokens=128)
    assert run.exact, (run.predicted, run.measured)
    assert run.most_nodes_per_token == {"unlimited": 4, "limited": 2}
    assert run.measured["limited"]["dedup"] <= run.bound_rows < run.measured["unlimited"]["dedup"]
    assert 0 < run.tokens_changed < 128
    assert run.row_bytes == 16 * 8  # float64 rows of d_model 16: the measured rows are wire bytes over this
