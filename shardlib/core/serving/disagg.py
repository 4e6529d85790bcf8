"""``disaggregated_on_rank``: a prefill pool and a decode pool of ranks in one job (Zhong et al. 2024,
DistServe; Patel et al. 2024, Splitwise).

Ranks ``0 .. P-1`` are the prefill pool, ranks ``P .. W-1`` the decode pool; each pool splits the model over
its own ranks with tensor parallelism (``TPGroup`` on a process group of the pool), and the two sizes may
differ (DistServe picks each phase's parallelism on its own). The prefill pool's leader (rank 0) runs the
engine's loop (``loop.run_engine``) on the arrivals, every request cut to one new token: a step computes
prompts (whole or in chunks) and samples their first token. When a prompt's last chunk is in a step, each
prefill rank announces it to the decode ranks it is linked to (``handoff.head_overlaps``: those that hold
some of its KV heads) and sends each its share of that request's K/V (``handoff.KVSender``): after the
step, or layer by layer during it. After the step the leader sends the first token to the decode pool's
leader (rank ``P``). That leader runs the same loop, its ``poll`` hook admitting the requests handed to it
(``admit_handed_off``), each with its prompt's K/V already computed (blocks allocated, the first token in
its output), tells its pool which blocks (one broadcast a step, as the colocated engine does), every decode
rank writes the K/V it received from each of its prefill ranks into them (``handoff.KVReceiver``), and the
pool decodes to the end. A one-token request is done after its prefill. Times: seconds after rank 0's start.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import torch

from shardlib.core.serving.engine import EngineRankResult, broadcast_step, pack, unpack
from shardlib.core.serving.handoff import KVReceiver, KVSender, head_overlaps, kv_heads_held
from shardlib.core.serving.loop import run_engine
from shardlib.core.serving.paged import PagedModel
from shardlib.core.serving.requests import SequenceState
from shardlib.core.serving.scheduler import Scheduler
from shardlib.core.tensor_parallel.layers import TPGroup


@dataclass(frozen=True)
class PoolGroups:
    prefill: object  # the prefill pool's process group (None with one rank)
    decode: object
    handoff: object  # every rank: the K/V's point-to-point messages, logged apart from the control channel


def pool_groups(ctx, prefill_ranks: int) -> PoolGroups:
    """The pools' process groups, made once per split and kept on the context (every rank calls this)."""
    cache = ctx.__dict__.setdefault("_pool_groups", {})
    key = (ctx.world_size, prefill_ranks)
    if key not in cache:
        p = prefill_ranks
        pre = ctx.new_group(range(p), "prefill") if p > 1 else None
        dec = ctx.new_group(range(p, ctx.world_size), "decode") if ctx.world_size - p > 1 else None
        cache[key] = PoolGroups(pre, dec, ctx.new_group(range(ctx.world_size), "handoff"))
    return cache[key]


def handoff_links(n_kv_heads: int, prefill_ranks: int, rank: int, world_size: int) -> list[tuple[int, slice]]:
    """``rank``'s links of the hand-off (``handoff.head_overlaps``): per peer in the other pool, its rank in
    the job and the heads they share, as a slice of ``rank``'s own KV heads."""
    p, d = prefill_ranks, world_size - prefill_ranks
    prefill = rank < p
    index = rank if prefill else rank - p
    held = kv_heads_held(index, p if prefill else d, n_kv_heads)
    return [(p + o.decode if prefill else o.prefill, slice(o.heads.start - held.start, o.heads.stop - held.start))
            for o in head_overlaps(n_kv_heads, p, d) if (o.prefill if prefill else o.decode) == index]


def disaggregated_on_rank(ctx, weights, requests, config, prefill_ranks: int,
                          layerwise: bool = False) -> EngineRankResult:
    """Serve ``requests`` with prefill on ranks ``0 .. prefill_ranks - 1`` and decode on the rest."""
    p = prefill_ranks
    groups = pool_groups(ctx, p)
    prefill = ctx.rank < p
    index = ctx.rank if prefill else ctx.rank - p
    ranks, group = (range(p), groups.prefill) if prefill else (range(p, ctx.world_size), groups.decode)
    pool = ctx.group(list(ranks), group)  # this rank's pool, its first rank leading
    model = PagedModel(weights, TPGroup(len(ranks), index, ctx.comm, group), config.num_blocks, config.block_size,
                       ctx.device)
    links = handoff_links(weights.config.n_kv_heads, p, ctx.rank, ctx.world_size)
    ctx.comm.barrier()
    start = float(ctx.comm.broadcast(torch.tensor([ctx.now_s()], dtype=torch.float64), src=0))

    def clock() -> float:
        return ctx.now_s() - start

    if prefill:
        return _prefill(ctx, pool, model, requests, config, p, index, KVSender(ctx.comm, links, groups.handoff),
                        layerwise, clock)
    return _decode(ctx, pool, model, requests, config, KVReceiver(ctx.comm, links, groups.handoff, model.cache,
                                                                  layerwise), clock)


def _prefill(ctx, pool, model, requests, config, p, index, sender, layerwise, clock) -> EngineRankResult:
    def run_step(chunks, ids):
        """The step, with the hand-off of every prompt it finishes (``ids``: their requests, in order)."""
        done = [(i, c, c.start + len(c.tokens)) for i, c in zip(ids, [c for c in chunks if c.sample])
                if requests[i].max_new_tokens > 1]
        for i, _, n in done:
            sender.announce(i, n)
        on_layer = None
        if layerwise and done:
            def on_layer(layer):
                for i, c, n in done:
                    sender.send(i, model.cache, c.table, n, layer)
        logits = model.step(chunks, on_layer)
        if not layerwise:
            for i, c, n in done:
                sender.send(i, model.cache, c.table, n)
        sender.poll()
        return logits

    if index != 0:  # a follower: compute what the leader broadcasts
        while (flat := broadcast_step(pool, None)).numel():
            run_step(*unpack(flat))  # the chunks, then the request of each that samples
        sender.end()
        sender.finish()
        return EngineRankResult.of(ctx.rank, model, kv_sent=tuple(sender.sent))

    index_of = {r.request_id: i for i, r in enumerate(requests)}
    first_only = [replace(r, max_new_tokens=1) for r in requests]

    def step(chunks):
        ids = [index_of[c.seq] for c in chunks if c.sample]
        if p > 1:
            broadcast_step(pool, torch.cat([pack(chunks), torch.tensor(ids, dtype=torch.int64)]))
        return run_step(chunks, ids)

    def record(plan, start_s, end_s, sched):  # the first token of each finished prompt, to the decode pool
        for c in plan.chunks:
            i = index_of[c.seq]
            if c.sample and requests[i].max_new_tokens > 1:
                seq = sched.finished[c.seq]
                sender.token(p, i, seq.output[0], seq.token_times_s[0])

    sched = run_engine(first_only, config, step, clock=clock, wait=ctx.wait_s, on_step=record)
    if p > 1:
        broadcast_step(pool, None)
    sender.end()
    sender.finish()
    return EngineRankResult.of(ctx.rank, model, sched, kv_sent=tuple(sender.sent))


def _pack_admits(admits) -> torch.Tensor:
    return torch.tensor([v for i, table in admits for v in (i, len(table), *table)], dtype=torch.int64)


def _unpack_admits(values: list[int]) -> list[tuple[int, tuple[int, ...]]]:
    admits, at = [], 0
    while at < len(values):
        i, n = values[at:at + 2]
        admits.append((i, tuple(values[at + 2:at + 2 + n])))
        at += 2 + n
    return admits


def _decode(ctx, pool, model, requests, config, inbox, clock) -> EngineRankResult:
    if pool.rank != 0:  # a follower: land what the leader admits, compute what it broadcasts
        while True:
            inbox.poll()
            flat = broadcast_step(pool, None)
            if not flat.numel():
                break
            chunks, rest = unpack(flat)
            for i, table in _unpack_admits(rest):
                inbox.land(i, table)
            if chunks:
                model.step(chunks)
        inbox.wait_end()
        return EngineRankResult.of(ctx.rank, model)

    handoff, first_s = {}, {}  # request id -> seconds from its first token to its K/V here; when it was sampled
    admits = []  # admissions not yet told to the pool

    def poll(sched, now_s):
        """``run_engine``'s hook: admit what has been handed off; while idle, block until something comes."""
        inbox.poll()
        if sched.idle and not inbox.tokens:
            if inbox.ended:
                return False
            inbox.poll(block=True)
        first_s.update((requests[i].request_id, t) for i, _, t in inbox.tokens)
        admits.extend(admit_handed_off(sched, inbox.tokens, requests, config))
        return not inbox.ended or bool(inbox.tokens)

    def step(chunks):
        if pool.world_size > 1:
            broadcast_step(pool, torch.cat([pack(chunks), _pack_admits(admits)]))
        for i, table in admits:  # the admitted requests' K/V into their blocks, before the step reads them
            inbox.land(i, table)
            handoff[requests[i].request_id] = clock() - first_s[requests[i].request_id]
        admits.clear()
        return model.step(chunks)

    sched = run_engine([], decode_config(config), step, clock=clock, wait=ctx.wait_s, poll=poll)
    if pool.world_size > 1:
        broadcast_step(pool, None)
    inbox.wait_end()
    # its blocks were allocated for K/V computed elsewhere: no prompt was looked up in its prefix cache
    return replace(EngineRankResult.of(ctx.rank, model, sched, handoff_s=handoff), prefix_hit_tokens=0,
                   prefix_lookup_tokens=0)


def admit_handed_off(sched: Scheduler, queue: deque, requests, config) -> list[tuple[int, tuple[int, ...]]]:
    """Admit the handed-off requests at the head of ``queue`` (``(request index, first token, its time)``)
    while the cache and ``max_num_seqs`` allow: each joins ``sched.running`` with its prompt's K/V counted
    as computed and its first token in its output. Returns ``(request index, block table)`` per admission."""
    admits = []
    while queue:
        i, first, first_s = queue[0]
        r = requests[i]
        n = len(r.prompt_token_ids)
        if config.max_num_seqs and len(sched.running) >= config.max_num_seqs:
            break
        if not sched.blocks.can_allocate(r.prompt_token_ids, n):
            break
        queue.popleft()
        seq = SequenceState(r, output=[first], computed=n, token_times_s=[first_s])
        sched.blocks.allocate(r.request_id, seq.tokens, n)
        sched.running.append(seq)
        admits.append((i, tuple(sched.blocks.tables[r.request_id])))
    return admits


def decode_config(config):
    """The decode pool's engine settings: the K/V arrive whole, so there is no prefix to share."""
    return replace(config, prefix_caching=False)
