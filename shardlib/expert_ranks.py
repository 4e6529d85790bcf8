"""Expert parallelism on ranks: experts placed on ranks, tokens dispatched and combined by all-to-all.

Each rank holds ``n_experts / world_size`` whole experts (GShard, Lepikhin et al. 2020;
Switch Transformer, Fedus et al. 2021) and a contiguous share of the tokens, its *home* tokens. One
forward of the layer, on every rank at once:

1. **route** its home tokens (``experts.route``) and apply the capacity cap to them (each rank's tokens
   are one GShard group);
2. **dispatch**: tell every rank how many token-slots are coming for each of its experts (an
   all-to-all of counts), then send the token rows themselves (an all-to-all with *uneven* splits,
   because the router decided how many go where);
3. **expert FFN**: run each hosted expert on the rows it received;
4. **combine**: send every result back where it came from (the reverse all-to-all, splits swapped);
5. **weighted sum at home**: ``x + sum of gate * result`` over the token's served slots.

Step 3 takes as long as the busiest rank's rows, and step 4 cannot finish on any rank before the
busiest rank has sent its results: one overloaded expert stalls everyone.

Replication: ``ExpertPlacement(replicas=((e, r),))`` puts a second copy of expert ``e`` on rank ``r``;
every home rank sends alternate rows for ``e`` to the two copies. The output is unchanged and the
busiest rank's load falls, at the price of a second copy of that expert's weights on rank ``r``.

The plan of a dispatch (``dispatch_plan``) is pure and drives both the rank function
(``ep_forward``) and a single-process simulation (``simulate_expert_parallel``), which replaces each
all-to-all with list shuffling. Every collective goes through ``ctx.comm``, so counts and bytes are
read from the comm log; this module never imports ``torch.distributed``. The plan, its two consumers
(the ranks and the simulation) and the measurements built on them live together.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from .checks import whole_number
from .experts import (MoEConfig, MoEOutput, MoEWeights, assign, check_tokens, combine, expert_ffn, load_stats,
                      moe_reference, route, split_groups)
from .timeline import now_s

BYTES_PER_VALUE = 4  # float32 rows


# -- placement ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertPlacement:
    """Expert ``e`` lives on rank ``e // (n_experts / world_size)``; ``replicas`` adds second copies."""

    n_experts: int
    world_size: int
    replicas: tuple[tuple[int, int], ...] = ()  # (expert, rank) pairs

    def __post_init__(self) -> None:
        for name in ("n_experts", "world_size"):
            whole_number(getattr(self, name), name)
        if self.n_experts % self.world_size:
            raise ValueError(
                f"{self.n_experts} experts cannot be placed on {self.world_size} ranks: expert parallelism gives "
                f"each rank the same whole number of experts ({self.n_experts} / {self.world_size} = "
                f"{self.n_experts / self.world_size:.3g}); use a world size that divides {self.n_experts}"
            )
        pairs = []
        for pair in self.replicas:
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise ValueError(f"replicas must be (expert, rank) pairs, for example ((6, 0),); got {pair!r} "
                                 f"in {self.replicas!r}")
            pairs.append((whole_number(pair[0], "a replica's expert", 0), whole_number(pair[1], "a replica's rank", 0)))
        object.__setattr__(self, "replicas", tuple(pairs))
        seen = set()
        for e, r in self.replicas:
            if not 0 <= e < self.n_experts or not 0 <= r < self.world_size:
                raise ValueError(f"replica ({e}, {r}) names expert {e} of 0 .. {self.n_experts - 1} on rank {r} "
                                 f"of 0 .. {self.world_size - 1}")
            if r == self.owner(e):
                raise ValueError(f"expert {e} already lives on rank {r}: its replica must go to another rank")
            if e in seen:
                raise ValueError(f"expert {e} has more than one replica; this layer supports one second copy")
            seen.add(e)

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.world_size

    def owner(self, expert: int) -> int:
        return expert // self.per_rank

    def copies(self, expert: int) -> tuple[int, ...]:
        """The ranks holding ``expert``: its owner first, then its replica."""
        return (self.owner(expert),) + tuple(r for e, r in self.replicas if e == expert)

    def hosted(self, rank: int) -> tuple[int, ...]:
        """The experts on ``rank``: its own block, then any replicas."""
        own = tuple(range(rank * self.per_rank, (rank + 1) * self.per_rank))
        return own + tuple(e for e, r in self.replicas if r == rank)

    @property
    def copy_slots(self) -> list[tuple[int, int]]:
        """Every ``(rank, expert)`` copy, rank by rank: the layout of a dispatch's count vector."""
        return [(r, e) for r in range(self.world_size) for e in self.hosted(r)]


def replicate_hottest(placement: ExpertPlacement, expert_counts) -> ExpertPlacement:
    """A placement with a second copy of the busiest expert on the least-loaded other rank (by the
    token-slots ``expert_counts`` sends to each rank; ties go to the lower number)."""
    counts = [int(c) for c in (expert_counts.tolist() if isinstance(expert_counts, torch.Tensor) else expert_counts)]
    if len(counts) != placement.n_experts:
        raise ValueError(f"expert_counts has {len(counts)} entries, one per expert is {placement.n_experts}")
    hot = max(range(len(counts)), key=lambda e: (counts[e], -e))
    load = [sum(counts[e] for e in placement.hosted(r)) for r in range(placement.world_size)]
    others = [r for r in range(placement.world_size) if r != placement.owner(hot)]
    if not others:
        raise ValueError("a replica needs a second rank: this placement has one rank")
    target = min(others, key=lambda r: (load[r], r))
    return ExpertPlacement(placement.n_experts, placement.world_size, ((hot, target),))


# -- the dispatch plan (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchPlan:
    """How one home rank sends its served token-slots."""

    order: torch.Tensor  # (rows,) flat slot ids ``t * k + s`` in send order (grouped by rank, then expert)
    counts: torch.Tensor  # (len(copy_slots),) rows for each (rank, expert) copy
    rows_to_rank: list[int]  # (world_size,) rows sent to each rank, itself included


def dispatch_plan(experts: torch.Tensor, kept: torch.Tensor, placement: ExpertPlacement) -> DispatchPlan:
    """Where each served slot of ``experts`` ``(T, k)`` goes, for one home rank."""
    slot_index = {copy: i for i, copy in enumerate(placement.copy_slots)}
    copy_of = torch.full((placement.n_experts, 2), -1, dtype=torch.long)  # expert -> copy slot of each copy
    n_copies = torch.ones(placement.n_experts, dtype=torch.long)
    for e in range(placement.n_experts):
        ranks = placement.copies(e)
        n_copies[e] = len(ranks)
        for c, r in enumerate(ranks):
            copy_of[e, c] = slot_index[(r, e)]
    slots = torch.nonzero(kept.flatten()).flatten()  # (rows,) served slots, token-major
    expert = experts.flatten()[slots]
    onehot = torch.nn.functional.one_hot(expert, placement.n_experts)
    nth = (onehot.cumsum(0) * onehot).sum(1) - 1  # this slot is the nth row for its expert here
    target = copy_of[expert, nth % n_copies[expert]]  # alternate rows between an expert's copies
    order = slots[torch.sort(target, stable=True).indices]
    counts = torch.bincount(target, minlength=len(slot_index))
    starts = [0]
    for r in range(placement.world_size):
        starts.append(starts[-1] + len(placement.hosted(r)))
    rows_to_rank = [int(counts[starts[r]:starts[r + 1]].sum()) for r in range(placement.world_size)]
    return DispatchPlan(order, counts, rows_to_rank)


def run_hosted_experts(received: torch.Tensor, counts: torch.Tensor, hosted: tuple[int, ...],
                       weights: MoEWeights) -> torch.Tensor:
    """Run each hosted expert on its rows. ``received`` ``(rows, d_model)`` holds, from each source rank
    in turn, its rows for ``hosted[0]``, then ``hosted[1]``...; ``counts`` is ``(world_size, len(hosted))``."""
    out = torch.empty_like(received)  # (rows, d_model)
    ends = counts.flatten().cumsum(0).view_as(counts)
    starts = ends - counts
    for p, e in enumerate(hosted):
        rows = torch.cat([torch.arange(int(a), int(b)) for a, b in zip(starts[:, p], ends[:, p])])
        if rows.numel():
            out[rows] = expert_ffn(received[rows], weights, e)
    return out


def predicted_all_to_all_bytes(n_tokens: int, k: int, d_model: int, bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes of token rows one dispatch (and, the same again, one combine) puts into its all-to-all,
    summed over ranks: every token sends ``k`` rows of ``d_model`` values, rows a rank keeps for
    itself included (``comm.py`` counts the input buffer). Fewer when a capacity cap drops slots."""
    return n_tokens * k * d_model * bytes_per_value


def predicted_cross_rank_share(world_size: int) -> float:
    """Share of dispatched rows that leave their home rank when routing is uniform: ``(w - 1) / w``."""
    return (world_size - 1) / world_size


# -- the rank function -------------------------------------------------------------------------------------------
def _check(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement, world_size: int) -> None:
    if placement.world_size != world_size or placement.n_experts != cfg.n_experts:
        raise ValueError(f"the placement is for {placement.n_experts} experts on {placement.world_size} ranks, but "
                         f"the layer has {cfg.n_experts} experts on {world_size} ranks")
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    check_tokens(x, cfg.d_model, weights.router.dtype)
    split_groups(x.shape[0], world_size)  # every rank needs a token


def ep_forward(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
               repeats: int = 1, extra_s_per_row: float = 0.0) -> dict:
    """One expert-parallel forward of ``x`` (the whole batch; this rank keeps its contiguous share),
    ``repeats`` times, each after a barrier. ``extra_s_per_row`` adds a sleep per expert row on top of
    the real FFN, for timing demonstrations that must survive a noisy machine.

    Returns this rank's output rows, what it sent and received, and per repeat its forward and expert
    seconds (wall clock, and the CPU time of the FFNs, which other programs on the machine do not
    inflate) and its start, expert-end and end times on the shared clock. Each rank is sent every
    expert's weights and uses only its own; a deployment would load only those.
    """
    _check(x, weights, cfg, placement, ctx.world_size)
    start, stop = split_groups(x.shape[0], ctx.world_size)[ctx.rank]
    x_home = x[start:stop].to(ctx.device)  # (T_r, d_model)
    hosted = placement.hosted(ctx.rank)
    hosted_counts = [len(placement.hosted(r)) for r in range(ctx.world_size)]
    result = {"forward_s": [], "expert_s": [], "expert_cpu_s": [], "start_s": [], "end_s": [], "expert_end_s": []}
    for _ in range(repeats):
        ctx.comm.barrier()
        first_record = len(ctx.comm.records)
        t0 = now_s()
        with ctx.timeline.span("route"):
            routing = route(x_home, weights.router, cfg)
            assignment = assign(routing, cfg)
            plan = dispatch_plan(assignment.experts, assignment.kept, placement)
        # dispatch: the counts first (so every rank knows what it will receive), then the rows
        counts_in = ctx.comm.all_to_all_single(plan.counts, hosted_counts, [len(hosted)] * ctx.world_size)
        counts_in = counts_in.view(ctx.world_size, len(hosted))  # (source rank, hosted expert)
        rows_from = counts_in.sum(1).tolist()
        send = x_home[plan.order // cfg.k]  # (rows sent, d_model), grouped by destination rank
        received = ctx.comm.all_to_all_single(send, plan.rows_to_rank, rows_from)  # (rows received, d_model)
        with ctx.timeline.span("experts", rows=received.shape[0]):
            t_expert, cpu_expert = now_s(), time.process_time()
            expert_out = run_hosted_experts(received, counts_in, hosted, weights)
            expert_cpu_s = time.process_time() - cpu_expert  # work done, whatever else shares the cores
            if extra_s_per_row:
                time.sleep(received.shape[0] * extra_s_per_row)
            expert_end_s = now_s()
        back = ctx.comm.all_to_all_single(expert_out, rows_from, plan.rows_to_rank)  # combine: in send order
        with ctx.timeline.span("weighted sum"):
            slot_outputs = x_home.new_zeros(x_home.shape[0] * cfg.k, cfg.d_model)  # (T_r * k, d_model)
            slot_outputs[plan.order] = back
            out = combine(x_home, routing.gates, slot_outputs.view(x_home.shape[0], cfg.k, -1), assignment.kept)
        t1 = now_s()
        for key, value in (("forward_s", t1 - t0), ("expert_s", expert_end_s - t_expert), ("start_s", t0),
                           ("end_s", t1), ("expert_end_s", expert_end_s), ("expert_cpu_s", expert_cpu_s)):
            result[key].append(value)
    counts_rec, tokens_rec, back_rec = [r for r in ctx.comm.records[first_record:] if r.op == "all_to_all_single"]
    result.update(
        output=out, rows_to_rank=plan.rows_to_rank, rows_from_rank=rows_from, expert_rows=int(received.shape[0]),
        expert_counts=assignment.counts(cfg.n_experts), dropped_slots=assignment.dropped_slots,
        dropped_tokens=assignment.dropped_tokens, rerouted_slots=assignment.rerouted_slots,
        capacity=assignment.capacity, counts_bytes=counts_rec.size_bytes, dispatch_bytes=tokens_rec.size_bytes,
        combine_bytes=back_rec.size_bytes, dispatch_s=tokens_rec.duration_s, combine_s=back_rec.duration_s,
        weight_bytes=len(hosted) * weights.expert_bytes,  # what this rank must hold (it was sent them all)
    )
    return result


# -- the same dispatch in one process -----------------------------------------------------------------------------
def simulate_expert_parallel(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                             placement: ExpertPlacement) -> dict:
    """``ep_forward``'s data movement with lists in place of all-to-alls, for any world size.

    Returns the joined output, the send matrix (rows from rank i to rank j) and each rank's expert rows.
    """
    w = placement.world_size
    _check(x, weights, cfg, placement, w)
    homes = [x[a:b] for a, b in split_groups(x.shape[0], w)]
    routed = [route(h, weights.router, cfg) for h in homes]
    assigned = [assign(r, cfg) for r in routed]
    plans = [dispatch_plan(a.experts, a.kept, placement) for a in assigned]
    sizes = [len(placement.hosted(r)) for r in range(w)]
    offsets = [sum(sizes[:r]) for r in range(w)]
    sends = [torch.split(h[p.order // cfg.k], p.rows_to_rank) for h, p in zip(homes, plans)]  # [src][dst]
    results = []  # [dst] -> output rows split per source
    for dst in range(w):
        counts = torch.stack([p.counts[offsets[dst]:offsets[dst] + sizes[dst]] for p in plans])  # (src, hosted)
        out = run_hosted_experts(torch.cat([sends[src][dst] for src in range(w)]), counts, placement.hosted(dst), weights)
        results.append(torch.split(out, counts.sum(1).tolist()))
    outputs = []
    for src, (h, r, a, p) in enumerate(zip(homes, routed, assigned, plans)):
        slot_outputs = h.new_zeros(h.shape[0] * cfg.k, cfg.d_model)
        slot_outputs[p.order] = torch.cat([results[dst][src] for dst in range(w)])
        outputs.append(combine(h, r.gates, slot_outputs.view(h.shape[0], cfg.k, -1), a.kept))
    return {"output": torch.cat(outputs), "send_matrix": [p.rows_to_rank for p in plans],
            "expert_rows": [sum(p.rows_to_rank[dst] for p in plans) for dst in range(w)]}


# -- running it from the notebook -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EPRun:
    """One expert-parallel forward on live ranks, gathered from every rank."""

    output: torch.Tensor  # (T, d_model), the home ranks' outputs joined in rank order
    send_matrix: list[list[int]]  # rows sent from rank i (row) to rank j (column)
    expert_rows: list[int]  # rows each rank's experts computed
    expert_counts: torch.Tensor  # (n_experts,) served token-slots per expert
    dropped_slots: int
    dropped_tokens: int
    rerouted_slots: int
    capacity: int | None  # per expert per rank
    expert_s: list[float]  # per rank, median over repeats: wall-clock seconds of the expert FFNs
    expert_cpu_s: list[float]  # per rank, median over repeats: CPU seconds of the FFNs (the sleep excluded)
    forward_s: list[float]  # per rank, median over repeats
    step_s: float  # median over repeats of (last rank's end - first rank's start)
    waited_for_slowest: bool  # in every repeat, no rank finished before the last rank's experts did
    dispatch_bytes: int  # token rows into the dispatch all-to-all, summed over ranks (from the comm log)
    combine_bytes: int
    counts_bytes: int
    weight_bytes: list[int]  # expert weights each rank holds
    placement: ExpertPlacement

    @property
    def cross_rank_share(self) -> float:
        total = sum(map(sum, self.send_matrix))
        off = total - sum(self.send_matrix[i][i] for i in range(len(self.send_matrix)))
        return off / total if total else 0.0


def run_expert_parallel(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                        placement: ExpertPlacement | None = None, repeats: int = 1,
                        extra_s_per_row: float = 0.0) -> EPRun:
    """Check the inputs here (a clear ``ValueError`` before any rank is involved), run ``ep_forward`` on
    every rank of ``ranks``, and gather the results."""
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size) if placement is None else placement
    _check(x, weights, cfg, placement, ranks.world_size)
    whole_number(repeats, "repeats")
    if isinstance(extra_s_per_row, bool) or not isinstance(extra_s_per_row, (int, float)) or extra_s_per_row < 0:
        raise ValueError(f"extra_s_per_row must be a number of seconds of at least 0, got {extra_s_per_row!r}")
    res = ranks.run(ep_forward, x, weights, cfg, placement, repeats, extra_s_per_row)
    steps = [max(r["end_s"][i] for r in res) - min(r["start_s"][i] for r in res) for i in range(repeats)]
    waited = all(min(r["end_s"][i] for r in res) >= max(r["expert_end_s"][i] for r in res) for i in range(repeats))
    return EPRun(
        output=torch.cat([r["output"] for r in res]), send_matrix=[r["rows_to_rank"] for r in res],
        expert_rows=[r["expert_rows"] for r in res], expert_counts=sum(r["expert_counts"] for r in res),
        dropped_slots=sum(r["dropped_slots"] for r in res), dropped_tokens=sum(r["dropped_tokens"] for r in res),
        rerouted_slots=sum(r["rerouted_slots"] for r in res), capacity=res[0]["capacity"],
        expert_s=[statistics.median(r["expert_s"]) for r in res],
        expert_cpu_s=[statistics.median(r["expert_cpu_s"]) for r in res],
        forward_s=[statistics.median(r["forward_s"]) for r in res], step_s=statistics.median(steps),
        waited_for_slowest=waited, weight_bytes=[r["weight_bytes"] for r in res],
        dispatch_bytes=sum(r["dispatch_bytes"] for r in res), combine_bytes=sum(r["combine_bytes"] for r in res),
        counts_bytes=sum(r["counts_bytes"] for r in res), placement=placement,
    )


def reference_for(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, world_size: int) -> MoEOutput:
    """The single-process layer that the layer on ``world_size`` ranks must equal: each rank's tokens
    form one capacity group."""
    return moe_reference(x, weights, cfg, n_groups=world_size)


# -- the knob against the mitigations -----------------------------------------------------------------------------
MITIGATIONS = ("none", "capacity", "capacity + reroute", "replicate hottest")


def mitigated(cfg: MoEConfig, mitigation: str, capacity_factor: float = 1.25) -> MoEConfig:
    """``cfg`` with ``mitigation``'s routing policy (replication changes the placement, not the policy)."""
    if mitigation not in MITIGATIONS:
        raise ValueError(f"mitigation must be one of {MITIGATIONS}, got {mitigation!r}")
    if mitigation == "capacity":
        return cfg.but(capacity_factor=capacity_factor, reroute=False)
    if mitigation == "capacity + reroute":
        return cfg.but(capacity_factor=capacity_factor, reroute=True)
    return cfg.but(capacity_factor=None, reroute=False)


def measure_mitigation(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, mitigation: str,
                       capacity_factor: float = 1.25, repeats: int = 3, uncapped: MoEOutput | None = None) -> dict:
    """One live run of ``cfg`` with ``mitigation``: loads, drops, output change, bytes and times.

    The output change is measured against the uncapped layer on the same tokens (``uncapped``, computed
    here unless given); replication is planned from its expert loads (in practice, from recent
    batches). ``exact`` compares the run with the single-process layer under the same policy."""
    plain = cfg.but(capacity_factor=None, reroute=False)
    uncapped = moe_reference(x, weights, plain) if uncapped is None else uncapped
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size)
    if mitigation == "replicate hottest":
        placement = replicate_hottest(placement, uncapped.counts(cfg.n_experts))
    policy = mitigated(cfg, mitigation, capacity_factor)
    run = run_expert_parallel(ranks, x, weights, policy, placement, repeats=repeats)
    same_policy = uncapped if policy == plain else reference_for(x, weights, policy, ranks.world_size)
    change = (run.output - uncapped.output).abs().max(dim=1).values  # (T,) per token
    return {
        "mitigation": mitigation, "skew": cfg.skew, "run": run,
        # max over the even share of every requested slot (dropped ones included): see load_stats
        "expert_max_over_mean": load_stats(run.expert_counts, total=x.shape[0] * cfg.k).max_over_mean,
        "rank_max_over_mean": load_stats(run.expert_rows, total=x.shape[0] * cfg.k).max_over_mean,
        "dropped_slots": run.dropped_slots, "dropped_tokens": run.dropped_tokens,
        "rerouted_slots": run.rerouted_slots, "tokens_changed": int((change > 0).sum()),
        "max_output_change": float(change.max()), "step_s": run.step_s, "slowest_expert_s": max(run.expert_s),
        "busiest_expert_cpu_s": max(run.expert_cpu_s),
        "exact": torch.equal(run.output, same_policy.output),
    }


def measure_mitigations(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, mitigations=MITIGATIONS,
                        capacity_factor: float = 1.25, repeats: int = 3) -> dict[str, dict]:
    """``measure_mitigation`` for each of ``mitigations``, sharing one uncapped reference."""
    uncapped = moe_reference(x, weights, cfg.but(capacity_factor=None, reroute=False))
    return {m: measure_mitigation(ranks, x, weights, cfg, m, capacity_factor, repeats, uncapped) for m in mitigations}


__all__ = ["ExpertPlacement", "replicate_hottest", "DispatchPlan", "dispatch_plan", "run_hosted_experts",
           "ep_forward", "simulate_expert_parallel", "EPRun", "run_expert_parallel", "reference_for",
           "predicted_all_to_all_bytes", "predicted_cross_rank_share", "MITIGATIONS", "mitigated",
           "measure_mitigation", "measure_mitigations"]
