"""Importable rank functions used by the tests (pickled by reference, like library functions)."""

import os
import time

import torch


def identity(ctx, *args, **kwargs):
    return {"rank": ctx.rank, "world_size": ctx.world_size, "args": args, "kwargs": kwargs}


def noop(ctx):
    return None


def skip_barrier_on_last(ctx):
    """Every rank but the last waits in a barrier the last rank never joins: a hang."""
    if ctx.rank != ctx.world_size - 1:
        ctx.comm.barrier()
    return ctx.rank


def raise_on(ctx, bad_rank):
    if ctx.rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {bad_rank}")
    ctx.comm.barrier()


def die_on(ctx, bad_rank):
    if ctx.rank == bad_rank:
        os._exit(3)
    ctx.comm.barrier()


def sleep_then_rank(ctx, seconds):
    time.sleep(seconds)
    return ctx.rank


def threads(ctx):
    return torch.get_num_threads()


def emulated_calls(ctx, node_of_rank, latency_s):
    """Inside-node and cross-node collectives and point-to-point under an emulated slow link."""
    from shardlib.facts.hardware import Link
    from shardlib.lab.costs.emulation import EmulatedLink

    nodes = sorted(set(node_of_rank))
    groups = {n: ctx.new_group([r for r, m in enumerate(node_of_rank) if m == n], f"node{n}") for n in nodes}
    ctx.comm.emulate(EmulatedLink(node_of_rank, Link("slow test link", 1e12, latency_s)))
    t = torch.ones(4)
    ctx.comm.all_reduce(t, group=groups[node_of_rank[ctx.rank]])  # inside a node
    ctx.comm.all_reduce(t)  # every rank: spans the nodes
    ctx.comm.all_reduce(t, async_op=True).wait()
    if ctx.rank in (0, ctx.world_size - 1):  # first and last rank sit on different nodes
        peer = ctx.world_size - 1 - ctx.rank
        ctx.comm.send(t, peer) if ctx.rank == 0 else ctx.comm.recv(t, peer)
    return [(r.op, r.group, r.emulated, r.start_s, r.start_s + r.duration_s) for r in ctx.comm.records]


def records_after_emulation(ctx):
    """The call after an emulating one: nothing is emulated any more."""
    ctx.comm.all_reduce(torch.ones(4))
    return [(r.op, r.emulated) for r in ctx.comm.records]


def emulate_with(ctx, node_of_rank):
    from shardlib.facts.hardware import INFINIBAND_400G
    from shardlib.lab.costs.emulation import EmulatedLink

    ctx.comm.emulate(EmulatedLink(node_of_rank, INFINIBAND_400G))


def decode_pieces_reference(ctx, x, layers, model, dp, m, steps):
    """Rank 0 decodes, in one process, the very pieces a layout's ranks decode (each replica's share cut
    into microbatches), with a rank's thread count: the bit-for-bit reference for a layout with no
    cross-rank sum (a matmul's rounding may depend on its row count and threads)."""
    if ctx.rank:
        return None
    from shardlib.core.toy import decode_reference
    return torch.cat([decode_reference(mb, layers, model, steps) for part in x.tensor_split(dp)
                      for mb in part.tensor_split(m)], dim=1)
