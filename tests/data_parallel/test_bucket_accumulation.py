"""``BucketedReplica`` over several microbatches per step (gradient accumulation), on real ranks: the
gradients of every microbatch add up in the buckets; DDP and ZeRO-1 send each bucket once, after its last
microbatch, ZeRO-2 after every microbatch. Against one process's gradient of the whole global batch
(float64; a cross-rank sum in another order: within ``TOLERANCE``)."""

import copy
import sys
from collections import Counter

import cloudpickle
import pytest
import torch
from torch import nn

from shardlib.core.checks import TOLERANCE
from shardlib.core.data_parallel.buckets import BucketedReplica

cloudpickle.register_pickle_by_value(sys.modules[__name__])
M, ROWS = 3, 2  # microbatches per step, rows per rank and microbatch


def _accumulate_on_rank(ctx, strategy, overlap):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 2)).double()
    ref = copy.deepcopy(model)
    x = torch.randn(M * ctx.world_size * ROWS, 4, dtype=torch.float64)  # the global batch, the same everywhere
    replica = BucketedReplica(ctx, model, strategy, 128, overlap, microbatches=M)  # 3 buckets
    replica.start_step()
    for k in range(M):
        rows = x.view(M, ctx.world_size, ROWS, 4)[k, ctx.rank]  # this rank's rows of microbatch k
        model(rows).pow(2).sum().backward()
    replica.finish_backward()
    ref(x).pow(2).sum().backward()  # one process, the whole batch
    ref_grads = [p.grad.flatten() for p in ref.parameters()]
    gap = 0.0
    for b, g in enumerate(replica.groups):
        flat = torch.zeros(g.padded_numel, dtype=torch.float64)
        for i, offset, numel in zip(g.params, g.offsets, g.numels):
            flat[offset:offset + numel] = ref_grads[i]
        start, stop = (0, g.padded_numel) if strategy == "ddp" else g.owned(ctx.rank)
        mine = replica.grads[b] if strategy == "ddp" else replica.owned[b].grad
        gap = max(gap, float((mine - flat[start:stop]).abs().max()))
    return gap, len(replica.groups), Counter(r.op for r in ctx.comm.records)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("strategy, op, sends", [("ddp", "all_reduce", 1), ("zero1", "reduce_scatter", 1),
                                                 ("zero2", "reduce_scatter", M)])
def test_microbatches_accumulate_and_each_bucket_is_sent_as_the_strategy_says(pool2, strategy, op, sends, overlap):
    for gap, buckets, calls in pool2.run(_accumulate_on_rank, strategy, overlap):
        assert gap < TOLERANCE
        assert buckets == 3 and calls == {op: sends * buckets}
