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
