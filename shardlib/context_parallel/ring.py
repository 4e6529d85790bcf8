"""Ring attention on a rank: each rank keeps its queries, and the keys and values travel round the ring.

Ring Attention (Liu, Zaharia and Abbeel 2023) splits a long sequence across ``n`` ranks. Rank ``r``
holds the queries, keys and values of its own tokens. Attention needs every query to meet every key,
so the K/V shards go round: at step ``i`` rank ``r`` holds the K/V of rank ``r - i`` (mod ``n``),
attends its queries to them, and passes them on to rank ``r + 1`` while taking rank ``r - 1``'s. After
``n`` steps every query has met every key and no rank ever held more than two K/V shards. The partial
results merge exactly with the online softmax (``online_softmax.merge``): the output equals attention
over the whole sequence, to float rounding.

* Causal attention skips blocks wholly in a query's future (``layouts.block_kind``). With the
  contiguous layout that leaves rank 0 almost idle and rank ``n - 1`` doing ``n`` blocks; the zigzag
  layout (``layout="zigzag"``) evens the work out.
* Overlap (``overlap=True``): the next block's transfer is started (``isend`` / ``irecv``) *before*
  the current block is computed and waited for after, so the bytes move while the rank computes; the
  comm log's ``waited_s`` says how much of each transfer was not hidden. ``overlap=False`` moves the
  block first and computes after: the baseline the overlap is measured against.
* K and V travel as one message per step, ``(2, batch, kv_heads, seq / n, head_dim)``: with
  grouped-query attention only the few KV heads travel, never the expanded ones.

Every step's computing is a compute span on ``ctx.timeline`` (attrs: the source rank, the blocks
computed whole and diagonal, and ``cpu_s``, the CPU time of this rank's thread: on a shared machine a
span's wall time also counts the moments another process held the core), every transfer a ``send`` /
``recv`` in the comm log.
"""

from __future__ import annotations

import time

import torch

from ..checks import flag, number_at_least
from .layouts import check_sequence, chunks_of_rank, chunks_per_rank
from .online_softmax import attend_block
from .reference import check_qkv, shard_sequence


def check_ring_inputs(q_shape, k_shape, v_shape, world_size: int, layout: str, local: bool) -> None:
    """Shapes (``reference.check_qkv``) and the sequence's split: of the whole sequence (``local=False``)
    or of one rank's shard (``local=True``), whose length times ``world_size`` is the whole sequence."""
    b, heads, kv_heads, seq, hd = check_qkv(q_shape, k_shape, v_shape)
    per = chunks_per_rank(layout)
    if local and seq % per:
        raise ValueError(f"the zigzag layout gives each rank 2 chunks, so a rank's shard of {seq} tokens must be "
                         f"even (the whole sequence a multiple of 2 x {world_size} = {2 * world_size})")
    check_sequence(seq * world_size if local else seq, world_size, layout)


def ring_attention(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                   layout: str = "contiguous", overlap: bool = True, scale: float | None = None,
                   pad_compute_s: float | None = None) -> torch.Tensor:
    """This rank's rows of attention over the whole sequence, by the ring (see the module docstring).

    ``q (batch, heads, seq / n, head_dim)``, ``k, v (batch, kv_heads, seq / n, head_dim)``: this rank's
    shard of the sequence in ``layout`` (``layouts.shard_sequence``). Returns ``(batch, heads, seq / n,
    head_dim)``, the same rows. Every rank of the job must call it.

    ``pad_compute_s``: pad each step's compute with sleep to that many seconds (the blocks are still
    computed for real). On a laptop the ranks' compute and the transfers share two cores, so a transfer
    slows the compute it hides under; padding sets the compute's length and leaves the cores free for
    the bytes, as a GPU's links leave its arithmetic free. ``None``: real compute only."""
    check_ring_inputs(q.shape, k.shape, v.shape, ctx.world_size, layout, local=True)
    flag(causal, "causal")
    flag(overlap, "overlap")
    pad = None if pad_compute_s is None else number_at_least(pad_compute_s, "pad_compute_s")
    n, me = ctx.world_size, ctx.rank
    q_ids = chunks_of_rank(me, n, layout)
    q_chunks = q.chunk(len(q_ids), dim=2)  # (b, H, chunk, hd) each
    acc = [None] * len(q_ids)  # the online-softmax partial of each query chunk
    kv = torch.stack([k, v]).contiguous()  # (2, b, KV, seq / n, hd): one message per step
    for step in range(n):
        src = (me - step) % n  # whose K/V this rank holds now
        moving = step < n - 1
        if moving:
            incoming = torch.empty_like(kv)
            transfer = (ctx.comm.isend(kv, (me + 1) % n), ctx.comm.irecv(incoming, (me - 1) % n))
            if not overlap:
                for pending in transfer:
                    pending.wait()
        start, cpu_start = time.perf_counter(), time.thread_time()
        visible, diagonal = attend_block(acc, q_chunks, q_ids, kv[0], kv[1], chunks_of_rank(src, n, layout),
                                         causal, scale)
        cpu_s = time.thread_time() - cpu_start  # this thread's own work: not the time other processes took the core
        if pad is not None and start + pad > time.perf_counter():
            time.sleep(start + pad - time.perf_counter())
        ctx.timeline.record(f"attend K/V of rank {src}", start, time.perf_counter(), kind="compute", step=step,
                            source=src, visible=visible, diagonal=diagonal, cpu_s=cpu_s, padded_to_s=pad)
        if moving:
            for pending in transfer:
                pending.wait()
            kv = incoming
    return torch.cat([a.out for a in acc], dim=2)


def ring_attention_on_rank(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True,
                           layout: str = "contiguous", overlap: bool = True, scale: float | None = None,
                           repeats: int = 1, pad_compute_s: float | None = None) -> dict:
    """``ring_attention`` on this rank's shard of the whole ``q, k, v`` (each rank takes its own), run
    ``repeats`` times, each after a barrier (the timeline and the comm log keep the last run).

    Returns ``output`` (this rank's rows), ``blocks`` (``(source, visible, diagonal)`` per step) and
    ``transfers`` (``(op, size_bytes, wire_bytes, duration_s, waited_s)`` each) of the last run, and
    one entry per run of: ``times_s`` (the whole pass), ``step_compute_s`` (compute per step, wall time
    with any padding), ``step_cpu_s`` (the same, CPU time of the computing thread),
    ``waited_s`` (blocked in ``wait()`` for transfers) and ``transfer_s`` (per moving step, the
    longer of the send and the receive, from issue to completion)."""
    check_ring_inputs(q.shape, k.shape, v.shape, ctx.world_size, layout, local=False)
    n, me = ctx.world_size, ctx.rank
    mine = [shard_sequence(t, n, layout)[me].to(ctx.device) for t in (q, k, v)]
    runs = {"times_s": [], "step_compute_s": [], "step_cpu_s": [], "waited_s": [], "transfer_s": []}
    for _ in range(max(1, int(repeats))):
        ctx.comm.barrier()
        ctx.comm.clear()
        ctx.timeline.clear()
        start = time.perf_counter()
        out = ring_attention(ctx, *mine, causal=causal, layout=layout, overlap=overlap, scale=scale,
                             pad_compute_s=pad_compute_s)
        runs["times_s"].append(time.perf_counter() - start)
        computed = [s for s in ctx.timeline.spans if s.kind == "compute"]
        runs["step_compute_s"].append([s.duration_s for s in computed])
        runs["step_cpu_s"].append([s.attrs["cpu_s"] for s in computed])
        moved = [c for c in ctx.comm.records if c.op in ("send", "recv")]
        runs["waited_s"].append(sum(c.waited_s or 0.0 for c in moved))
        runs["transfer_s"].append(sum(max(pair) for pair in zip(*[[c.duration_s for c in moved if c.op == op]
                                                                   for op in ("send", "recv")])))
    spans = [s for s in ctx.timeline.spans if s.kind == "compute"]
    return {"output": out, **runs,
            "blocks": [(s.attrs["source"], s.attrs["visible"], s.attrs["diagonal"]) for s in spans],
            "transfers": [(c.op, c.size_bytes, c.wire_bytes, c.duration_s, c.waited_s) for c in ctx.comm.records
                          if c.op in ("send", "recv")]}


def exchange_sweep_on_rank(ctx, sizes_bytes, rounds: int = 3) -> dict:
    """Time the ring's own exchange, every rank sending ``size`` bytes to the next while receiving as
    much from the previous (not one message alone: on one machine the two directions share the cores
    and the wire), each size ``rounds`` times after a barrier and one untimed warm-up.

    Returns ``{("point_to_point", size_bytes): [seconds per round]}``, the layout of
    ``costs.ranks.sweep_on_rank``, so ``costs.calibration`` fits it the same way."""
    n, me = ctx.world_size, ctx.rank
    out = {}
    for size in sizes_bytes:
        x = torch.ones(int(size) // 4, device=ctx.device)  # (size / 4,) float32
        y = torch.empty_like(x)
        times = []
        for _ in range(int(rounds) + 1):
            ctx.comm.barrier()
            start = time.perf_counter()
            for pending in (ctx.comm.isend(x, (me + 1) % n), ctx.comm.irecv(y, (me - 1) % n)):
                pending.wait()
            times.append(time.perf_counter() - start)
        out[("point_to_point", int(size))] = times[1:]
    return out
