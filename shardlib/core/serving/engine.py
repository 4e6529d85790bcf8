"""``serving_engine_on_rank``: the engine on real ranks, the scheduler on rank 0, the model step on all.

Rank 0 runs the loop (``loop.run_engine``); before each step it broadcasts the step's chunks (tokens,
positions, block tables, packed into one int64 tensor) and every rank runs its tensor-parallel share of
the model step on them (``paged.PagedModel``); the two all-reduces a layer make the logits the same on
every rank, and rank 0 samples. An empty broadcast ends the loop. Times are rank 0's clock, seconds
after the start. Given a ``RankGroup`` (one replica's ranks), the same runs inside the group, its first
rank leading.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.serving.loop import run_engine
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.scheduler import Chunk
from shardlib.core.tensor_parallel.layers import TPGroup


@dataclass(frozen=True)
class StepRecord:
    """One engine step: tokens computed, decodes among them, sequences, keys attended, and when (seconds);
    after it, the cache's blocks in use and the tokens they hold."""

    n_tokens: int
    n_decodes: int
    n_sequences: int
    n_context: int
    start_s: float
    end_s: float
    blocks_used: int
    tokens_held: int

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @classmethod
    def after(cls, plan, start_s: float, end_s: float, sched) -> "StepRecord":
        """The record of ``plan``, run from ``start_s`` to ``end_s``, read from the scheduler after it."""
        return cls(plan.n_tokens, plan.n_decodes, len(plan.chunks), plan.n_context, start_s, end_s,
                   sched.blocks.stats().used, sched.tokens_held)


@dataclass(frozen=True)
class EngineRankResult:
    """What one rank saw: rank 0 has every request's tokens and token times, every rank its cache size."""

    rank: int
    kv_cache_bytes: int
    outputs: dict | None  # rank 0: request id -> (tokens, token times, preemptions)
    steps: tuple[StepRecord, ...] = ()
    prefix_hit_tokens: int = 0
    prefix_lookup_tokens: int = 0
    preemptions: int = 0


def pack(chunks) -> torch.Tensor:
    """Chunks as one int64 tensor: per chunk ``start, n_tokens, n_table, sample``, its tokens, its table."""
    flat = [len(chunks)]
    for c in chunks:
        flat += [c.start, len(c.tokens), len(c.table), int(c.sample), *c.tokens, *c.table]
    return torch.tensor(flat, dtype=torch.int64)


def unpack(flat: torch.Tensor) -> list[Chunk]:
    values, at, chunks = flat.tolist(), 1, []
    for _ in range(values[0]):
        start, n, n_table, sample = values[at:at + 4]
        at += 4
        chunks.append(Chunk(None, start, tuple(values[at:at + n]), tuple(values[at + n:at + n + n_table]),
                            bool(sample)))
        at += n + n_table
    return chunks


def broadcast_step(job, flat: torch.Tensor | None) -> torch.Tensor:
    """The leader's packed step (``flat`` on the first rank of ``job``, ``None`` elsewhere) to every rank of
    ``job`` (the context, or a ``RankGroup``), its length first; an empty one says the loop is over."""
    size = job.comm.broadcast(torch.tensor([0 if flat is None else flat.numel()]), src=0)
    if int(size) == 0:
        return torch.empty(0, dtype=torch.int64)
    return job.comm.broadcast(torch.empty(int(size), dtype=torch.int64) if flat is None else flat, src=0)


def outputs_of(sched) -> dict:
    """Request id -> (tokens, token times, preemptions) of every finished sequence."""
    return {rid: (tuple(s.output), tuple(s.token_times_s), s.preemptions) for rid, s in sched.finished.items()}


def serving_engine_on_rank(ctx, weights, requests, config, group=None, poll=None, on_step=None,
                           start_s: float | None = None) -> EngineRankResult:
    """Serve ``requests`` with tensor parallelism over every rank of the job, or over ``group`` (a
    ``RankGroup``). The leader's ``run_engine`` gets ``poll`` and ``on_step``; its times count from the
    ``perf_counter`` reading ``start_s`` (default: its own, after the barrier)."""
    job = ctx if group is None else group
    tpg = TPGroup.world(ctx) if group is None else TPGroup(group.world_size, group.rank, ctx.comm,
                                                           group.process_group)
    model = PagedModel(weights, tpg, config.num_blocks, config.block_size, ctx.device)
    if job.world_size > 1:
        job.comm.barrier()
    if job.rank != 0:
        while (flat := broadcast_step(job, None)).numel():
            model.step(unpack(flat))
        return EngineRankResult(ctx.rank, model.cache.size_bytes, None)

    steps: list[StepRecord] = []
    start = ctx.now_s() if start_s is None else start_s

    def step(chunks):
        if job.world_size > 1:  # alone, there is no one to tell
            broadcast_step(job, pack(chunks))
        return model.step(chunks)

    def record(plan, start_s, end_s, sched):
        steps.append(StepRecord.after(plan, start_s, end_s, sched))
        if on_step is not None:
            on_step(plan, start_s, end_s, sched)

    sched = run_engine(requests, config, step, clock=lambda: ctx.now_s() - start,
                       wait=ctx.wait_s, on_step=record, poll=poll)
    if job.world_size > 1:
        broadcast_step(job, None)
    stats = sched.blocks.stats()
    return EngineRankResult(ctx.rank, model.cache.size_bytes, outputs_of(sched), tuple(steps), stats.hit_tokens,
                            stats.lookup_tokens, sched.preemptions)
