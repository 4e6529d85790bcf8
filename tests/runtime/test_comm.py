"""Recorded collectives: each op against a single-process reference, at world sizes 2 and 4.

Inputs are small integers in float32, so sums are exact and every comparison is ``torch.equal``.
"""

import math

import pytest
import torch

from shardlib.runtime.errors import RankError
from shardlib.runtime.records import format_log, summarize


def rank_input(rank, shape=(4, 6)):
    """What rank ``rank`` starts with: distinct small integers, reproducible in the parent."""
    g = torch.Generator().manual_seed(rank)
    return torch.randint(-5, 6, shape, generator=g).float()


def _all_reduce(ctx, op):
    t = rank_input(ctx.rank)
    return ctx.comm.all_reduce(t, op=op)


@pytest.mark.parametrize("op, reduce", [("sum", lambda xs: sum(xs)), ("max", lambda xs: torch.stack(xs).amax(0))])
def test_all_reduce(pool, op, reduce):
    n = pool.world_size
    expected = reduce([rank_input(r) for r in range(n)])
    out = pool.run(_all_reduce, op)
    assert all(torch.equal(o, expected) for o in out)
    assert [(r.op, r.size_bytes, r.group) for r in pool.last_comm] == [("all_reduce", 4 * 6 * 4, "world")] * n


def _broadcast(ctx):
    return ctx.comm.broadcast(rank_input(ctx.rank), src=1)


def test_broadcast(pool):
    out = pool.run(_broadcast)
    assert all(torch.equal(o, rank_input(1)) for o in out)


def _all_gather(ctx, dim):
    return ctx.comm.all_gather(rank_input(ctx.rank), dim=dim)


@pytest.mark.parametrize("dim", [0, 1])
def test_all_gather(pool, dim):
    n = pool.world_size
    expected = torch.cat([rank_input(r) for r in range(n)], dim=dim)
    out = pool.run(_all_gather, dim)
    assert all(torch.equal(o, expected) for o in out)
    assert {r.size_bytes for r in pool.last_comm} == {n * 4 * 6 * 4}  # the whole gathered output


def _reduce_scatter(ctx, dim, shape):
    return ctx.comm.reduce_scatter(rank_input(ctx.rank, shape), dim=dim)


@pytest.mark.parametrize("dim", [0, 1])
def test_reduce_scatter(pool, dim):
    n = pool.world_size
    shape = (4 * n, 3) if dim == 0 else (3, 4 * n)
    total = sum(rank_input(r, shape) for r in range(n))
    out = pool.run(_reduce_scatter, dim, shape)
    assert all(torch.equal(o, chunk) for o, chunk in zip(out, total.chunk(n, dim=dim)))
    assert {r.size_bytes for r in pool.last_comm} == {4 * n * 3 * 4}  # the whole input


def test_reduce_scatter_refuses_an_uneven_split(pool4):
    with pytest.raises(RankError, match=r"dim 0 \(size 6\) into 4 equal chunks"):
        pool4.run(_reduce_scatter, 0, (6, 2))


def _all_to_all_even(ctx):
    n = ctx.world_size
    rows = torch.arange(n * 2, dtype=torch.float32).unsqueeze(1) + 100 * ctx.rank  # block j goes to rank j
    return ctx.comm.all_to_all_single(rows)


def test_all_to_all_even(pool):
    n = pool.world_size
    out = pool.run(_all_to_all_even)
    for j, received in enumerate(out):
        expected = torch.cat([torch.tensor([[2.0 * j + 100 * i], [2.0 * j + 1 + 100 * i]]) for i in range(n)])
        assert torch.equal(received, expected)


def _all_to_all_uneven(ctx):
    n = ctx.world_size
    counts = [(ctx.rank + j) % 3 for j in range(n)]  # rank i sends (i + j) % 3 rows to rank j
    rows = torch.cat([torch.full((c, 2), float(10 * ctx.rank + j)) for j, c in enumerate(counts)])
    incoming = ctx.comm.exchange_counts(counts)
    return incoming, ctx.comm.all_to_all_single(rows, counts, incoming)


def test_all_to_all_uneven_with_counts_first(pool):
    n = pool.world_size
    out = pool.run(_all_to_all_uneven)
    for j, (incoming, received) in enumerate(out):
        assert incoming == [(i + j) % 3 for i in range(n)]
        expected = torch.cat([torch.full(((i + j) % 3, 2), float(10 * i + j)) for i in range(n)])
        assert torch.equal(received, expected)
    ops = [r.op for r in pool.last_comm if r.rank == 0]
    assert ops == ["all_to_all_single", "all_to_all_single"]  # counts, then rows: two collectives


def _ring(ctx):
    n = ctx.world_size
    right, left = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    mine = torch.full((3,), float(ctx.rank))
    got = torch.empty(3)
    if ctx.rank % 2 == 0:  # alternate the order so blocking send/recv cannot deadlock
        ctx.comm.send(mine, right)
        ctx.comm.recv(got, left)
    else:
        ctx.comm.recv(got, left)
        ctx.comm.send(mine, right)
    return got


def test_send_recv_ring(pool):
    n = pool.world_size
    out = pool.run(_ring)
    assert [o.tolist() for o in out] == [[float((r - 1) % n)] * 3 for r in range(n)]
    sends = [r for r in pool.last_comm if r.op == "send"]
    assert [(r.rank, r.peer, r.size_bytes) for r in sorted(sends, key=lambda r: r.rank)] == [
        (r, (r + 1) % n, 12) for r in range(n)
    ]


def _subgroups(ctx):
    n = ctx.world_size
    evens = ctx.new_group(range(0, n, 2), name="even")
    odds = ctx.new_group(range(1, n, 2), name="odd")
    mine = evens if ctx.rank % 2 == 0 else odds
    t = torch.tensor([float(ctx.rank)])
    ctx.comm.all_reduce(t, group=mine)
    ctx.comm.barrier()
    return t.item()


def test_subgroups_are_logged_by_name(pool4):
    assert pool4.run(_subgroups) == [2.0, 4.0, 2.0, 4.0]
    groups = {(r.rank, r.op): r.group for r in pool4.last_comm}
    assert groups[(0, "all_reduce")] == "even" and groups[(3, "all_reduce")] == "odd"
    assert groups[(0, "barrier")] == "world"


def test_summary_and_log_count_what_ran(pool2):
    pool2.run(lambda ctx: [ctx.comm.all_reduce(torch.ones(8)) for _ in range(3)])
    summary = summarize(pool2.last_comm)
    assert summary["all_reduce"]["count"] == 6 and summary["all_reduce"]["size_bytes"] == 6 * 32
    records = [r for r in pool2.last_comm if r.op == "all_reduce"]
    assert summary["all_reduce"]["duration_s"] == pytest.approx(sum(r.duration_s for r in records))
    assert summary["all_reduce"]["wire_bytes"] == sum(r.wire_bytes for r in records) == 6 * 32  # 2(n-1)/n = 1
    assert format_log(pool2.last_comm).count("all_reduce") == 6


def test_comm_log_resets_each_call(pool2):
    pool2.run(lambda ctx: ctx.comm.barrier())
    pool2.run(lambda ctx: None)
    assert pool2.last_comm == [] and pool2.last_spans == []


def test_uneven_all_to_all_needs_both_split_lists(pool2):
    with pytest.raises(RankError, match="needs both input_split_sizes and output_split_sizes"):
        pool2.run(lambda ctx: ctx.comm.all_to_all_single(torch.ones(3), [1, 2]))


# -- wire bytes --------------------------------------------------------------------------------------------
def test_wire_bytes_by_hand():
    from shardlib.runtime.records import wire_bytes

    # a 1,200-byte buffer on 4 ranks: the ring all-reduce sends 2 x 3/4 of it per rank, an all-gather 3/4
    assert wire_bytes("all_reduce", 1200, 4) == 1800 and wire_bytes("all_gather", 1200, 4) == 900
    assert wire_bytes("reduce_scatter", 1200, 2) == 600 and wire_bytes("send", 1200, 2) == 1200
    assert wire_bytes("recv", 1200, 2) == 0 and wire_bytes("all_reduce", 1200, 1) == 0
    with pytest.raises(ValueError, match="no wire count for 'gossip'"):
        wire_bytes("gossip", 1, 2)


def _every_op(ctx):
    t = torch.ones(8, 3)  # 96 bytes
    ctx.comm.all_reduce(t.clone())
    ctx.comm.all_gather(t)
    ctx.comm.reduce_scatter(torch.ones(8 * ctx.world_size, 3))
    # uneven all-to-all: rank r sends r + 1 rows to every other rank and 1 row to itself
    n = ctx.world_size
    ins = [1 if j == ctx.rank else ctx.rank + 1 for j in range(n)]
    outs = [1 if j == ctx.rank else j + 1 for j in range(n)]
    ctx.comm.all_to_all_single(torch.ones(sum(ins), 3), ins, outs)
    return None


def test_every_record_carries_its_wire_bytes(pool):
    n = pool.world_size
    pool.run(_every_op)
    rank0 = {r.op: r for r in pool.last_comm if r.rank == 0}
    assert rank0["all_reduce"].wire_bytes == round(2 * (n - 1) / n * 96)
    assert rank0["all_gather"].wire_bytes == round((n - 1) / n * n * 96)  # of the whole gathered output
    assert rank0["reduce_scatter"].wire_bytes == round((n - 1) / n * n * 96)  # of the whole input
    for rank in range(n):  # rows sent to other ranks: (n - 1) blocks of rank + 1 rows of 12 bytes
        a2a = next(r for r in pool.last_comm if r.rank == rank and r.op == "all_to_all_single")
        assert a2a.wire_bytes == (n - 1) * (rank + 1) * 12
    assert all(r.waited_s is None for r in pool.last_comm)  # blocking calls


# -- asynchronous calls ------------------------------------------------------------------------------------
def _async_all_reduce_under_compute(ctx, sleep_s):
    import time

    t = rank_input(ctx.rank)
    pending = ctx.comm.all_reduce(t, async_op=True)
    assert not ctx.comm.records  # nothing is logged until it is waited for
    time.sleep(sleep_s)  # "compute" while the bytes move
    out = pending.wait()
    assert pending.wait() is out  # waiting twice is harmless
    return out


def test_an_asynchronous_all_reduce_is_exact_and_logged_once_at_its_wait(pool):
    n = pool.world_size
    out = pool.run(_async_all_reduce_under_compute, 0.2)
    expected = sum(rank_input(r) for r in range(n))
    assert all(torch.equal(o, expected) for o in out)
    records = [r for r in pool.last_comm if r.op == "all_reduce"]
    assert sorted(r.rank for r in records) == list(range(n)) and all(r.waited_s is not None for r in records)
    assert all(r.size_bytes == 96 for r in records)  # logged at wait(), once, with its bytes
    # the flight and the wait are durations: finite, never negative (how long is the benchmarks' to say)
    assert all(math.isfinite(t) and t >= 0 for r in records for t in (r.duration_s, r.waited_s))


def _ring_exchange(ctx):
    """Every rank sends to its right neighbour and receives from its left, all at once, asynchronously:
    with blocking sends on gloo this pattern would hang (each send waits for a receive)."""
    n, r = ctx.world_size, ctx.rank
    right, left = (r + 1) % n, (r - 1) % n
    inbox = torch.zeros(5)
    send = ctx.comm.isend(torch.full((5,), float(r)), right)
    recv = ctx.comm.irecv(inbox, left)
    got = recv.wait()
    send.wait()
    return got


def test_isend_and_irecv_pass_a_ring_without_deadlock(pool):
    n = pool.world_size
    out = pool.run(_ring_exchange)
    assert [o.tolist() for o in out] == [[float((r - 1) % n)] * 5 for r in range(n)]
    sends = [r for r in pool.last_comm if r.op == "send"]
    recvs = [r for r in pool.last_comm if r.op == "recv"]
    assert len(sends) == len(recvs) == n
    assert all(s.wire_bytes == 20 for s in sends) and all(r.wire_bytes == 0 for r in recvs)
    assert {(s.rank, s.peer) for s in sends} == {(r, (r + 1) % n) for r in range(n)}
