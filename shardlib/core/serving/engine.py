"""``serving_engine_on_rank``: the engine on real ranks, the scheduler on rank 0, the model step on all.

Rank 0 runs the loop (``loop.run_engine``); before each step it broadcasts the step's chunks (tokens,
positions, block tables, packed into one int64 tensor) and every rank runs its tensor-parallel share of
the model step on them (``paged.PagedModel``; a Mixtral's experts spread over the same ranks); each layer's
collectives leave the logits the same on every rank, and rank 0 samples. An empty broadcast ends the loop.
Times are rank 0's clock, seconds after the start. Given a ``RankGroup`` (one replica's ranks), the same runs
inside the group, its first rank leading.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.serving.loop import StepRecord, run_engine
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.scheduler import Chunk
from shardlib.core.tensor_parallel.layers import TPGroup


@dataclass(frozen=True)
class EngineRankResult:
    """What one rank saw: a leader has its requests' tokens and token times and its steps, every rank its
    cache size. A prefill rank of a disaggregated job adds the request and decode rank of each K/V message
    it sent (in its comm log's order); the decode pool's leader, per request, the seconds from its first
    token to its K/V in the cache (the hand-off as the decode pool saw it)."""

    rank: int
    kv_cache_bytes: int
    outputs: dict | None  # a leader: request id -> (tokens, token times, preemptions)
    steps: tuple[StepRecord, ...] = ()
    prefix_hit_tokens: int = 0
    prefix_lookup_tokens: int = 0
    preemptions: int = 0
    kv_sent: tuple[tuple[int, int], ...] = ()  # (request index, decode rank) per K/V message, in the comm log's order
    handoff_s: dict | None = None
    cache_entries: int = 0  # tokens whose K/V (or latent) this rank stored, each time one was computed

    @classmethod
    def of(cls, rank: int, model, sched=None, **extra) -> "EngineRankResult":
        """A follower's result (``sched`` None), or a leader's read from its scheduler after the loop."""
        extra.setdefault("cache_entries", model.cache.entries_written)
        if sched is None:
            return cls(rank, model.cache.size_bytes, None, **extra)
        stats = sched.blocks.stats()
        outputs = {rid: (tuple(s.output), tuple(s.token_times_s), s.preemptions) for rid, s in sched.finished.items()}
        return cls(rank, model.cache.size_bytes, outputs, tuple(sched.steps), stats.hit_tokens, stats.lookup_tokens,
                   sched.preemptions, **extra)


def pack(chunks) -> torch.Tensor:
    """Chunks as one int64 tensor: per chunk ``start, n_tokens, n_table, sample``, its tokens, its table."""
    flat = [len(chunks)]
    for c in chunks:
        flat += [c.start, len(c.tokens), len(c.table), int(c.sample), *c.tokens, *c.table]
    return torch.tensor(flat, dtype=torch.int64)


def unpack(flat: torch.Tensor) -> tuple[list[Chunk], list[int]]:
    """``pack``'s chunks, and the values after them (what a caller appended)."""
    values, at, chunks = flat.tolist(), 1, []
    for _ in range(values[0]):
        start, n, n_table, sample = values[at:at + 4]
        at += 4
        chunks.append(Chunk(None, start, tuple(values[at:at + n]), tuple(values[at + n:at + n + n_table]),
                            bool(sample)))
        at += n + n_table
    return chunks, values[at:]


def broadcast_step(job, flat: torch.Tensor | None) -> torch.Tensor:
    """The leader's packed step (``flat`` on the first rank of ``job``, ``None`` elsewhere) to every rank of
    ``job`` (the context, or a ``RankGroup``), its length first; an empty one says the loop is over."""
    size = job.comm.broadcast(torch.tensor([0 if flat is None else flat.numel()]), 0)  # from the first rank
    if int(size) == 0:
        return torch.empty(0, dtype=torch.int64)
    return job.comm.broadcast(torch.empty(int(size), dtype=torch.int64) if flat is None else flat, 0)


def data_parallel_step(model: PagedModel, group: TPGroup, chunks, owners) -> torch.Tensor:
    """Attention data-parallel (DeepSeek-V3's decode layout, its report's section 3.4.2): each rank runs only the
    chunks it owns, whose cache lives on it alone; every layer's experts join all ranks by all-to-all. The sampled
    rows' logits are gathered (padded to the most any rank has) and returned in the plan's order."""
    logits = model.step([c for c, o in zip(chunks, owners) if o == group.index])  # (my sampled, V)
    sampled = [o for c, o in zip(chunks, owners) if c.sample]  # each sampled chunk's owner, in the plan's order
    width = max(sampled.count(r) for r in range(group.tp)) if sampled else 0
    if width == 0 or group.tp == 1:
        return logits
    padded = torch.cat([logits, logits.new_zeros(width - logits.shape[0], logits.shape[1])])  # (width, V)
    every = group.all_gather(padded, 0)  # (ranks x width, V)
    rows, seen = [], [0] * group.tp
    for o in sampled:  # the owner's next row
        rows.append(o * width + seen[o])
        seen[o] += 1
    return every[rows]


def serving_engine_on_rank(ctx, weights, requests, config, group=None, poll=None, on_step=None,
                           start_s: float | None = None, dp_attention: bool = False) -> EngineRankResult:
    """Serve ``requests`` with tensor parallelism over every rank of the job, or over ``group`` (a
    ``RankGroup``); ``dp_attention``: each rank every head and its own sequences, the experts spread over the
    ranks (the leader hands each new sequence to the next rank in turn). The leader's ``run_engine`` gets
    ``poll`` and ``on_step``; its times count from the ``perf_counter`` reading ``start_s`` (default: its own,
    after the barrier)."""
    job = ctx if group is None else group
    tpg = TPGroup.world(ctx) if group is None else TPGroup(group.world_size, group.rank, ctx.comm,
                                                           group.process_group)
    model = (PagedModel(weights, TPGroup(1, 0), config.num_blocks, config.block_size, ctx.device, experts=tpg)
             if dp_attention else PagedModel(weights, tpg, config.num_blocks, config.block_size, ctx.device))
    if job.world_size > 1:
        job.comm.barrier()
    if job.rank != 0:
        while (flat := broadcast_step(job, None)).numel():
            chunks, owners = unpack(flat)
            data_parallel_step(model, tpg, chunks, owners) if dp_attention else model.step(chunks)
        return EngineRankResult.of(ctx.rank, model)

    start, owner = ctx.now_s() if start_s is None else start_s, {}

    def step(chunks):
        owners = [owner.setdefault(c.seq, len(owner) % job.world_size) for c in chunks] if dp_attention else []
        if job.world_size > 1:  # alone, there is no one to tell
            broadcast_step(job, torch.cat([pack(chunks), torch.tensor(owners, dtype=torch.int64)]))
        return data_parallel_step(model, tpg, chunks, owners) if dp_attention else model.step(chunks)

    sched = run_engine(requests, config, step, clock=lambda: ctx.now_s() - start,
                       wait=ctx.wait_s, on_step=on_step, poll=poll)
    if job.world_size > 1:
        broadcast_step(job, None)
    return EngineRankResult.of(ctx.rank, model, sched)
