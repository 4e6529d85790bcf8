"""``ctx.group``: some ranks as a job of their own. Places, not global ranks, in every call; the calls
still go through ``ctx.comm``, logged under the group's name with the global peer."""

import sys
from types import SimpleNamespace

import cloudpickle
import pytest
import torch

from shardlib.runtime.context import RankGroup

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _pairs_on_rank(ctx):
    """Ranks 0 and 2 are one group, 1 and 3 another: a sum, a gather and an exchange inside each."""
    made = {tuple(g): ctx.new_group(g, f"pair{g[0]}") for g in ([0, 2], [1, 3])}
    ranks = [0, 2] if ctx.rank in (0, 2) else [1, 3]
    g = ctx.group(ranks, made[tuple(ranks)])
    mine = torch.tensor([float(ctx.rank)])
    total = g.comm.all_reduce(mine.clone())
    gathered = g.comm.all_gather(mine)
    got = torch.zeros(1)
    pending = (g.comm.isend(mine, 1 - g.rank), g.comm.irecv(got, 1 - g.rank))  # to the other place
    for p in pending:
        p.wait()
    return (g.rank, g.world_size, float(total), gathered.tolist(), float(got),
            sorted({(r.group, r.peer) for r in ctx.comm.records}, key=str))


def test_a_group_runs_by_place_and_logs_under_its_name(pool4):
    out = pool4.run(_pairs_on_rank)
    assert [o[:5] for o in out] == [(0, 2, 2.0, [0.0, 2.0], 2.0), (0, 2, 4.0, [1.0, 3.0], 3.0),
                                    (1, 2, 2.0, [0.0, 2.0], 0.0), (1, 2, 4.0, [1.0, 3.0], 1.0)]
    assert out[0][5] == [("pair0", 2), ("pair0", None)]  # the exchange's peer is the global rank
    assert out[3][5] == [("pair1", 1), ("pair1", None)]


def test_a_rank_outside_the_group_is_told_so():
    ctx = SimpleNamespace(rank=2, device=torch.device("cpu"), comm=None)
    with pytest.raises(ValueError, match=r"rank 2 is not in the group \[0, 1\]"):
        RankGroup(ctx, [0, 1], None)
