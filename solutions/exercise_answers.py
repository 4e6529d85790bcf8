"""Instructor solutions to the exercises in ``notebooks/exercises/``. Kept apart from the starters.

Each function is one answer that ``shardlib.exercises`` passes; the solution notebooks beside this file
print each one and run its grader, and ``tests/test_exercises.py`` checks them too.
"""

from __future__ import annotations

import numpy as np
import torch

from shardlib.exercises.serving_at_scale import PrefixRouterState


# -- 01 tensor parallelism ------------------------------------------------------------------------------
def shard_rows(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """Split an ``(out, in)`` weight along dim 1 (its input features) into ``n_shards`` equal slices."""
    out_features, in_features = weight.shape
    if n_shards < 1 or in_features % n_shards:
        raise ValueError(f"{in_features} input features cannot be split {n_shards} ways into equal whole slices")
    width = in_features // n_shards
    return [weight[:, i * width:(i + 1) * width] for i in range(n_shards)]  # each (out, in / n)


def tp_pair_forward(ctx, x, w1, b1, w2, b2):
    """``gelu(x @ w1.T + b1) @ w2.T + b2`` on this rank: w1 and b1 by columns, w2 by rows, one all-reduce."""
    import torch.nn.functional as F

    tp, r = ctx.world_size, ctx.rank
    w1_mine = w1.chunk(tp, dim=0)[r]  # (d_hidden / tp, d_model): some whole hidden features
    b1_mine = b1.chunk(tp, dim=0)[r]  # (d_hidden / tp,)
    w2_mine = w2.chunk(tp, dim=1)[r]  # (d_model, d_hidden / tp): the same hidden features, as inputs
    hidden = F.gelu(F.linear(x, w1_mine, b1_mine))  # (b, s, d_hidden / tp): no communication
    partial = F.linear(hidden, w2_mine)  # (b, s, d_model): this rank's share of the sum
    return ctx.comm.all_reduce(partial) + b2  # the bias once, after the sum


# -- 02 communication costs -----------------------------------------------------------------------------
def fit_alpha_beta(sizes_bytes, times_s):
    """Least squares on t = alpha + size / bandwidth, each equation divided by its own time (relative
    errors), the latency clamped at zero."""
    sizes, times = np.asarray(sizes_bytes, dtype=float), np.asarray(times_s, dtype=float)
    a = np.stack([np.ones_like(sizes), sizes], axis=1) / times[:, None]  # (points, 2): [1, S] / t
    (latency, seconds_per_byte), *_ = np.linalg.lstsq(a, np.ones_like(times), rcond=None)
    if latency < 0:  # noise pushed the intercept below zero: refit the slope alone
        col = sizes / times
        latency, seconds_per_byte = 0.0, col.sum() / (col ** 2).sum()
    return float(latency), float(1.0 / seconds_per_byte)


# -- 03 pipeline parallelism ----------------------------------------------------------------------------
def bubble_fraction(n_stages: int, n_microbatches: int) -> float:
    """The idle share of one forward-only pass: ``m + p - 1`` slots, of which each stage works ``m``."""
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"a pipeline needs at least 1 stage and 1 microbatch, got n_stages = {n_stages}, "
                         f"n_microbatches = {n_microbatches}")
    return (n_stages - 1) / (n_microbatches + n_stages - 1)


def pass_time(n_stages: int, n_microbatches: int, stage_s: float, hop_s: float) -> float:
    """The first microbatch's trip (p stages, p - 1 hops), then one leaves each stage-time behind it."""
    if n_stages < 1 or n_microbatches < 1:
        raise ValueError(f"a pipeline needs at least 1 stage and 1 microbatch, got {n_stages} and {n_microbatches}")
    return (n_microbatches + n_stages - 1) * stage_s + (n_stages - 1) * hop_s


# -- 09 pipeline schedules ------------------------------------------------------------------------------
def one_f_one_b(stage: int, n_stages: int, n_microbatches: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s 1F1B order (PipeDream-Flush, as Megatron-LM runs it): ``p - s - 1`` forwards fill the
    pipeline, then one forward and one backward in turn, then the backwards left drain it."""
    warmup = min(n_stages - stage - 1, n_microbatches)  # forwards before the first backward can come back
    order = [("F", i) for i in range(warmup)]
    for k in range(n_microbatches - warmup):  # steady state: at most p - s microbatches held
        order += [("F", warmup + k), ("B", k)]
    return order + [("B", i) for i in range(n_microbatches - warmup, n_microbatches)]


def small_table() -> list[list[str]]:
    """ZB-H1 by hand for 2 stages and 2 microbatches: stage 0 runs both forwards first; stage 1, the last,
    runs each B right after its F and holds its first W back to fill the wait for F1."""
    return [["F0", "F1", "B0", "W0", "B1", "W1"],
            ["F0", "B0", "F1", "B1", "W0", "W1"]]


def my_schedule(n_stages: int, n_microbatches: int) -> list[list[str]]:
    """ZB-H1 as a table: 1F1B's F and B order; stage s keeps up to s W's waiting, the rest run after their B."""
    rows = []
    for s in range(n_stages):
        warmup = min(n_stages - 1 - s, n_microbatches)
        row = [f"F{i}" for i in range(warmup)]
        waiting = []
        for k in range(n_microbatches):
            if warmup + k < n_microbatches:
                row.append(f"F{warmup + k}")
            row.append(f"B{k}")
            waiting.append(f"W{k}")
            if len(waiting) > s:
                row.append(waiting.pop(0))
        rows.append(row + waiting)
    return rows


# -- 04 expert parallelism ------------------------------------------------------------------------------
def top_k_router(x: torch.Tensor, router: torch.Tensor, k: int):
    """Each token's ``k`` best experts and their gates, a softmax over the ``k`` chosen logits."""
    logits = x @ router.T  # (T, n_experts)
    top_logits, experts = logits.topk(k, dim=-1)  # each (T, k), highest first
    return experts, torch.softmax(top_logits, dim=-1)  # gates sum to 1 per token


def plan_dispatch(experts: torch.Tensor, n_experts: int, ep: int):
    """Send order and per-rank row counts for one home rank's slots (expert ``e`` on rank ``e // per_rank``)."""
    per_rank = n_experts // ep
    flat = experts.flatten()  # (T * k,): slot id t * k + c -> its expert
    order = torch.sort(flat, stable=True).indices  # by expert (so by rank), slot-id order kept within one
    rows_to_rank = torch.bincount(flat // per_rank, minlength=ep).tolist()
    return order, rows_to_rank


# -- 05 serving layouts: a rank's place in the mesh -------------------------------------------------
def mesh_coordinates(rank: int, tp: int, pp: int, dp: int) -> tuple[int, int, int]:
    """(stage, replica, tp_rank) of a global rank: tp innermost, then replicas, stages outermost."""
    block, tp_rank = divmod(rank, tp)  # tp consecutive ranks share a block: one (stage, replica)
    stage, replica = divmod(block, dp)
    return stage, replica, tp_rank


def mesh_groups(rank: int, tp: int, pp: int, dp: int) -> dict[str, list[int]]:
    """The ranks that share everything with ``rank`` but one coordinate, per axis."""
    stage, replica, t = mesh_coordinates(rank, tp, pp, dp)

    def at(s: int, d: int, i: int) -> int:
        return (s * dp + d) * tp + i

    return {"tp": [at(stage, replica, i) for i in range(tp)],
            "pp": [at(s, replica, t) for s in range(pp)],
            "dp": [at(stage, d, t) for d in range(dp)]}


# -- 11 training step -----------------------------------------------------------------------------------
def rank_memory(config, layout, rank: int) -> dict[str, int]:
    """The bytes ``rank`` keeps between training steps, and its activations at 1F1B's in-flight peak."""
    from shardlib.exercises.training_ledger import activation_bytes_per_microbatch, parameters_per_unit

    stage, e, n = layout.position(rank).stage, config.element_bytes, layout.dp * layout.cp
    full = parameters_per_unit(config)
    units = (([full["embedding"]] if stage == 0 else []) + [full["block"]] * (config.n_layers // layout.pp)
             + ([full["head"]] if stage == layout.pp - 1 else []))
    units = [u // layout.tp for u in units]  # tp splits every matrix: heads, d_ff, vocabulary rows
    p = sum(units)  # this rank's parameters

    def shard(numel: int) -> int:  # padded up to a multiple of n = dp x cp, then cut n ways
        return -(-numel // n)

    if layout.dp_strategy == "ddp":
        weights, grads, moments = p, p, p
    elif layout.dp_strategy in ("zero1", "zero2"):  # full weights; AdamW steps on a view of my shard
        weights, moments = p, shard(p)
        grads = p if layout.dp_strategy == "zero1" else shard(p)
    else:  # ZeRO-3: each unit's shard only
        weights = grads = moments = sum(shard(u) for u in units)
    in_flight = min(layout.pp - stage, config.m)  # 1F1B on stage s
    return {"weights": weights * e, "gradients": grads * e, "optimizer": 2 * moments * e,
            "activations": activation_bytes_per_microbatch(config, layout, rank) * in_flight}


def aux_free_route(ctx, scores: torch.Tensor, bias: torch.Tensor, k: int, rate: float):
    """DeepSeek-V3's auxiliary-loss-free balancing on one rank: choose by ``scores + bias``, weigh by the
    chosen scores alone (normalised), move the bias by ``rate * sign(mean load - load)`` on the whole step's load."""
    experts = torch.topk(scores + bias, k, dim=-1).indices  # (T_r, k): the bias chooses
    chosen = scores.gather(1, experts)  # (T_r, k): the bias never weighs
    gates = chosen / chosen.sum(dim=-1, keepdim=True)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1])  # (n_experts,) this rank's slots
    ctx.comm.all_reduce(counts)  # the whole step's load, the same on every rank
    load = counts.to(bias.dtype)
    return experts, gates, bias + rate * torch.sign(load.mean() - load)


# -- 08 data parallelism --------------------------------------------------------------------------------
def zero1_step(ctx, params: torch.Tensor, grads: torch.Tensor, optimizer) -> torch.Tensor:
    """ZeRO-1's step: reduce-scatter the gradient, step my shard, all-gather the shards (DDP's bytes)."""
    n, r = ctx.world_size, ctx.rank
    my_grad = ctx.comm.reduce_scatter(grads)  # (len / n,): the sum over the ranks of my shard's gradient
    my_weights = params.chunk(n)[r]  # (len / n,): the same chunk of the weights, the only ones I update
    updated = optimizer(my_weights, my_grad)  # optimizer state for my shard only
    return ctx.comm.all_gather(updated)  # (len,): every rank's updated shard, in rank order


# -- 10 context parallelism -----------------------------------------------------------------------------
def merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b):
    """Attention over two blocks of keys from each block's own (out, max, sum): the online softmax's merge."""
    new_max = torch.maximum(max_a, max_b)  # (..., rows)
    w_a = sum_a * torch.exp(max_a - new_max)  # block a's share of the new denominator; exp of a difference <= 0
    w_b = sum_b * torch.exp(max_b - new_max)
    new_sum = w_a + w_b
    out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / new_sum.unsqueeze(-1)  # (..., rows, head_dim)
    return out, new_max, new_sum


# -- the serving engine: the block manager with prefix reuse ------------------------------------------------
class PrefixBlockManager:
    """Blocks handed out and taken back, full blocks named by a hash chained to their parent's name."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))  # least recently freed first
        self.refs = [0] * num_blocks
        self.tables: dict = {}
        self.cached: dict = {}  # name -> block
        self.name_of: dict = {}  # block -> name

    def allocate(self, seq, tokens) -> int:
        from shardlib.core.serving.blocks import block_hash

        bs, table, parent = self.block_size, [], None
        usable = len(tokens) - 1  # the last token is computed whatever the cache holds
        for start in range(0, usable - usable % bs, bs):  # the longest cached run of full blocks
            name = block_hash(parent, tokens[start:start + bs])
            if name not in self.cached:
                break
            table.append(self.cached[name])
            parent = name
        cached = len(table) * bs
        for block in table:
            if self.refs[block] == 0:
                self.free_blocks.remove(block)  # cached but free: taken back
            self.refs[block] += 1
        for _ in range(len(table), -(-len(tokens) // bs)):
            block = self.free_blocks.pop(0)
            old = self.name_of.pop(block, None)  # handed out again: its old name no longer finds it
            if old is not None and self.cached.get(old) == block:
                del self.cached[old]
            self.refs[block] = 1
            table.append(block)  # no name yet: its K/V are computed by the next step
        self.tables[seq] = table
        return cached

    def seal(self, seq, tokens) -> None:
        from shardlib.core.serving.blocks import block_hash

        bs, parent = self.block_size, None
        for i in range(len(tokens) // bs):  # full blocks only: a partial one may still change
            name = block_hash(parent, tokens[i * bs:(i + 1) * bs])
            block = self.tables[seq][i]
            if name not in self.cached:  # an equal block elsewhere keeps the name: this one stays private
                self.cached[name], self.name_of[block] = block, name
            parent = name

    def free(self, seq) -> None:
        for block in reversed(self.tables.pop(seq)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_blocks.append(block)


# -- 07 serving at scale: the prefix-aware router -----------------------------------------------------------
class PrefixRouter(PrefixRouterState):
    """SGLang's cache-aware choice: the least queued replica when the queues are imbalanced (most minus
    least above the threshold) or no replica holds a block of the prompt; else the longest match, ties to
    the fewer queued, then the lower index. The decision recorded: one more queued there, the prompt
    remembered in its tree."""

    def route(self, request) -> int:
        queued, replicas = self.queued, range(len(self.queued))
        least = min(replicas, key=lambda i: (queued[i], i))
        if max(queued) - min(queued) > self.balance_threshold:
            choice = least  # imbalanced: balance, whatever the prefixes say
        else:
            matched = self.matched_blocks(request)  # per replica: leading full blocks its tree holds
            choice = least if max(matched) == 0 else min(replicas, key=lambda i: (-matched[i], queued[i], i))
        self.queued[choice] += 1
        self.remember(choice, request)
        return choice
