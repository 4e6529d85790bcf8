"""This machine's latency and bandwidth: a sweep of message sizes timed on ranks, and the alpha-beta fit.

A round calls ``sweep_on_rank`` once: for each message size a burst of calls back to back, each burst a
span (as in nccl-tests, a burst over its calls is one call). The points of a round run in turn, reversed
every other round, so a burst of other work spoils a round of many points, not all of one. Each point
keeps its slowest rank per round, then its fastest (or median) round (``predict.alpha_beta.slowest_samples``),
and ``fit_link`` fits the line. A pool larger than the group runs the sweep on its first ranks
(``leading_group``); the other ranks return ``None`` at once. Every argument is checked before any rank runs.
"""

from __future__ import annotations

import time

import torch

from shardlib.core.checks import whole_number
from shardlib.lab.harness import on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.alpha_beta import (
    DEFAULT_CALLS,
    DEFAULT_ROUNDS,
    DEFAULT_SIZES_BYTES,
    ROUND_STATISTICS,
    SWEEP_OPS,
    Calibration,
    check_sizes,
    collective_time_s,
    fit_link,
    slowest_samples,
)

GROWTH_AT_LEAST = 2.0  # the largest message of a sweep takes at least twice the smallest's time


def leading_group(ctx, n_ranks: int | None):
    """``(mesh, member)``: the first ``n_ranks`` ranks of the pool as the ``"tp"`` axis of
    ``ctx.device_mesh`` (``None`` for the whole pool), and whether this rank is one of them."""
    n = ctx.world_size if n_ranks is None else whole_number(n_ranks, "n_ranks (the ranks of the group)", 2)
    if n == ctx.world_size:
        return None, True
    if ctx.world_size % n:
        raise ValueError(f"a group of the first {n} ranks needs a pool whose size is a multiple of {n}, "
                         f"got {ctx.world_size} ranks")
    return ctx.device_mesh((ctx.world_size // n, n), ("copy", "tp")), ctx.rank < n


def sweep_on_rank(ctx, points, n_ranks: int | None = None) -> None:
    """One round on the first ``n_ranks`` ranks (all by default): for each ``(op, size_bytes, calls)`` of
    ``points``, ``calls`` calls of ``op`` on ``size_bytes`` of float32 back to back, as one span ``"burst"``:
    an all-reduce or all-to-all of the group, or a ping-pong (rank 0 sends, rank 1 sends it back)."""
    mesh, member = leading_group(ctx, n_ranks)
    if not member:
        return
    group = None if mesh is None else mesh.get_group("tp")
    for op, size_bytes, calls in points:
        if op == "point_to_point" and ctx.rank > 1:
            continue
        x = torch.ones(size_bytes // 4, device=ctx.device)  # (size_bytes / 4,) float32
        with ctx.timeline.span("burst", kind="comm", op=op, size_bytes=size_bytes):
            for _ in range(calls):
                if op == "all_reduce":
                    ctx.comm.all_reduce(x, group=group)
                elif op == "all_to_all":
                    ctx.comm.all_to_all_single(x, group=group)
                elif ctx.rank == 0:  # point-to-point: rank 0 sends, rank 1 sends the message back
                    ctx.comm.send(x, 1)
                    ctx.comm.recv(x, 1)
                else:
                    ctx.comm.recv(x, 0)
                    ctx.comm.send(x, 0)


def group_size(ranks, n_ranks: int | None, what: str) -> int:
    """The ranks a measurement runs on: all of ``ranks`` or its first ``n_ranks``."""
    n = ranks.world_size if n_ranks is None else whole_number(n_ranks, f"{what} (the ranks it runs on)")
    if n < 2:
        raise ValueError(f"{what} needs at least 2 ranks, got {n}")
    if n > ranks.world_size or ranks.world_size % n:
        raise ValueError(f"{what} = {n} needs a pool whose size is a multiple of {n}; this pool has "
                         f"{ranks.world_size} ranks")
    return n


def sweep(ranks, points, rounds: int, degrees) -> dict[int, list]:
    """``{n: per rank, {(op, size_bytes): [seconds per call, one a round]}}`` on the first ``n`` ranks for
    each of ``degrees`` (``None`` for a rank outside the group or the ping-pong). A round is one
    ``sweep_on_rank`` per degree; the first round runs twice and keeps the second (buffers allocated). A
    rank's time runs from the last rank's start of a burst to its own end, over ``calls``."""
    out = {n: [{} for _ in range(ranks.world_size)] for n in degrees}
    for r in range(rounds):
        for n in degrees:
            got = on_ranks(ranks, sweep_on_rank, points[::1 - 2 * (r % 2)], n, repeats=2 if r == 0 else 1)
            for op, size, calls in points:
                bursts = [s for s in got.spans("burst") if (s.attrs["op"], s.attrs["size_bytes"]) == (op, size)]
                last_start = max(s.start_s for s in bursts)
                per_call = calls * (2 if op == "point_to_point" else 1)  # a ping-pong's one way: half a round trip
                for rank in range(n):  # None outside the ping-pong
                    out[n][rank].setdefault((op, size), [] if rank < len(bursts) else None)
                for s in bursts:
                    out[n][s.rank][(op, size)].append((s.end_s - last_start) / per_call)
    return {n: [times or None for times in per_rank] for n, per_rank in out.items()}


def run_calibration(ranks, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
                    latency_charge: str = "per_step", n_ranks: int | None = None, statistic: str = "fastest",
                    ops=SWEEP_OPS) -> Calibration:
    """Sweep ``ops`` over ``sizes_bytes`` on ``ranks`` (a ``Ranks`` pool; on its first ``n_ranks`` ranks if
    given), ``rounds`` rounds of ``calls`` calls, and fit this machine's latency and bandwidth to each
    point's ``statistic`` round: ``"fastest"`` (the floor: what the link costs when nothing else gets in
    the way) or ``"median"`` (the typical call)."""
    if ranks.world_size < 2:
        raise ValueError(f"a communication sweep needs at least 2 ranks, got a pool of {ranks.world_size}")
    if statistic not in ROUND_STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(ROUND_STATISTICS)}, got {statistic!r}")
    ops = tuple(ops)
    if not ops or any(op not in SWEEP_OPS for op in ops):
        raise ValueError(f"the sweep times some of {', '.join(SWEEP_OPS)}; got {ops!r}")
    n = group_size(ranks, n_ranks, "n_ranks")
    whole_number(rounds, "rounds"), whole_number(calls, "calls")
    sizes = check_sizes(sizes_bytes, n)
    start = time.perf_counter()
    per_rank = sweep(ranks, [(op, size, calls) for size in sizes for op in ops], rounds, (n,))[n]
    samples = slowest_samples(per_rank, n, statistic)
    per_op = {op: fit_link([s for s in samples if s.op == op], latency_charge) for op in ops}
    return Calibration(tuple(samples), fit_link(samples, latency_charge), per_op, time.perf_counter() - start,
                       latency_charge, ranks.backend)


def _size(size_bytes: int) -> str:
    for unit, scale in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale:,} {unit}"
    return f"{size_bytes:,} B"


def calibration_verdicts(cal: Calibration) -> tuple[Verdict, ...]:
    """Per operation of ``cal``: its largest message took at least ``GROWTH_AT_LEAST`` times its smallest's
    (bytes cost time), the operation's own fit's ratio beside it for scale."""
    out = []
    for op, fit in cal.per_op.items():
        mine = sorted((s for s in cal.samples if s.op == op), key=lambda s: s.size_bytes)
        small, large = mine[0], mine[-1]
        link = fit.link()
        predicted = (collective_time_s(op, large.size_bytes, large.n_ranks, link, cal.latency_charge)
                     / collective_time_s(op, small.size_bytes, small.n_ranks, link, cal.latency_charge))
        what = f"{op.replace('_', '-')}, {_size(large.size_bytes)} over {_size(small.size_bytes)}"
        out.append(Verdict.one_sided(what, predicted, large.seconds / small.seconds, "x", at_least=GROWTH_AT_LEAST))
    return tuple(out)


def run_calibration_check(ranks, n_ranks: int = 2, attempts: int = 3,
                          **kwargs) -> tuple[Calibration, tuple[Verdict, ...]]:
    """``run_calibration`` on the first ``n_ranks`` ranks (fastest rounds; other arguments as it takes them),
    measured again while a verdict of ``calibration_verdicts`` does not hold (a busy machine only slows a run)."""
    kwargs.setdefault("statistic", "fastest")
    return verified(lambda: run_calibration(ranks, n_ranks=n_ranks, **kwargs), calibration_verdicts, attempts)
