"""Where experts live, and how one rank's token-slots are sent to them: the dispatch plan.

Each rank of an expert-parallel group of ``ep`` ranks holds ``n_experts / ep`` whole experts (GShard,
Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021) and a contiguous share of the tokens, its
*home* tokens. ``ExpertPlacement`` says which rank holds which expert (and any second copy of a hot
one: ``replicas``); ``dispatch_plan`` says, for one home rank, which rows go to which rank and expert.
The plan drives both the rank function (``ranks.ep_forward_on_rank``) and a single-process simulation
(``simulate_expert_parallel``), which replaces each all-to-all with list shuffling, at any ``ep``.

Replication: ``ExpertPlacement(replicas=((e, r),))`` puts a second copy of expert ``e`` on rank ``r``;
every home rank sends alternate rows for ``e`` to the two copies. The output is unchanged and the
busiest rank's load falls, at the price of a second copy of that expert's weights on rank ``r``.

Torch, one process, never ``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import whole_number
from .layer import MoEWeights, combine, expert_ffn
from .routing import MoEConfig, assign, check_tokens, route, split_groups

BYTES_PER_VALUE = 4  # float32 rows


# -- placement ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpertPlacement:
    """Expert ``e`` lives on rank ``e // (n_experts / ep)``; ``replicas`` adds second copies."""

    n_experts: int
    ep: int
    replicas: tuple[tuple[int, int], ...] = ()  # (expert, rank) pairs

    def __post_init__(self) -> None:
        for name in ("n_experts", "ep"):
            whole_number(getattr(self, name), name)
        if self.n_experts % self.ep:
            raise ValueError(
                f"{self.n_experts} experts cannot be placed on {self.ep} ranks: expert parallelism gives "
                f"each rank the same whole number of experts ({self.n_experts} / {self.ep} = "
                f"{self.n_experts / self.ep:.3g}); use an ep that divides {self.n_experts}"
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
            if not 0 <= e < self.n_experts or not 0 <= r < self.ep:
                raise ValueError(f"replica ({e}, {r}) names expert {e} of 0 .. {self.n_experts - 1} on rank {r} "
                                 f"of 0 .. {self.ep - 1}")
            if r == self.owner(e):
                raise ValueError(f"expert {e} already lives on rank {r}: its replica must go to another rank")
            if e in seen:
                raise ValueError(f"expert {e} has more than one replica; this layer supports one second copy")
            seen.add(e)

    @property
    def per_rank(self) -> int:
        return self.n_experts // self.ep

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
        return [(r, e) for r in range(self.ep) for e in self.hosted(r)]


def replicate_hottest(placement: ExpertPlacement, expert_counts) -> ExpertPlacement:
    """A placement with a second copy of the busiest expert on the least-loaded other rank (by the
    token-slots ``expert_counts`` sends to each rank; ties go to the lower number)."""
    counts = [int(c) for c in (expert_counts.tolist() if isinstance(expert_counts, torch.Tensor) else expert_counts)]
    if len(counts) != placement.n_experts:
        raise ValueError(f"expert_counts has {len(counts)} entries, one per expert is {placement.n_experts}")
    hot = max(range(len(counts)), key=lambda e: (counts[e], -e))
    load = [sum(counts[e] for e in placement.hosted(r)) for r in range(placement.ep)]
    others = [r for r in range(placement.ep) if r != placement.owner(hot)]
    if not others:
        raise ValueError("a replica needs a second rank: this placement has one rank")
    target = min(others, key=lambda r: (load[r], r))
    return ExpertPlacement(placement.n_experts, placement.ep, ((hot, target),))


# -- the dispatch plan (pure) ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DispatchPlan:
    """How one home rank sends its served token-slots."""

    order: torch.Tensor  # (rows,) flat slot ids ``t * k + s`` in send order (grouped by rank, then expert)
    counts: torch.Tensor  # (len(copy_slots),) rows for each (rank, expert) copy
    rows_to_rank: list[int]  # (ep,) rows sent to each rank, itself included


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
    for r in range(placement.ep):
        starts.append(starts[-1] + len(placement.hosted(r)))
    rows_to_rank = [int(counts[starts[r]:starts[r + 1]].sum()) for r in range(placement.ep)]
    return DispatchPlan(order, counts, rows_to_rank)


def run_hosted_experts(received: torch.Tensor, counts: torch.Tensor, hosted: tuple[int, ...],
                       weights: MoEWeights) -> torch.Tensor:
    """Run each hosted expert on its rows. ``received`` ``(rows, d_model)`` holds, from each source rank
    in turn, its rows for ``hosted[0]``, then ``hosted[1]``...; ``counts`` is ``(ep, len(hosted))``."""
    out = torch.empty_like(received)  # (rows, d_model)
    ends = counts.flatten().cumsum(0).view_as(counts)
    starts = ends - counts
    for p, e in enumerate(hosted):
        rows = torch.cat([torch.arange(int(a), int(b)) for a, b in zip(starts[:, p], ends[:, p])])
        if rows.numel():
            out[rows] = expert_ffn(received[rows], weights, e)
    return out


def predicted_weight_bytes(placement: ExpertPlacement, cfg: MoEConfig,
                           bytes_per_value: int = BYTES_PER_VALUE) -> list[int]:
    """Expert weight bytes each rank must hold: its ``n_experts / ep`` experts and any replica, each three
    ``d_model x d_ff`` matrices (gate, up, down). A replica's price is one more expert on its rank:
    ``3 d_model d_ff`` values."""
    one_expert = 3 * cfg.d_model * cfg.d_ff * bytes_per_value
    return [len(placement.hosted(r)) * one_expert for r in range(placement.ep)]


def predicted_all_to_all_bytes(n_tokens: int, k: int, d_model: int, bytes_per_value: int = BYTES_PER_VALUE) -> int:
    """Bytes of token rows one dispatch (and, the same again, one combine) puts into its all-to-all,
    summed over ranks: every token sends ``k`` rows of ``d_model`` values, rows a rank keeps for
    itself included (``comm.py`` counts the input buffer). Fewer when a capacity cap drops slots."""
    return n_tokens * k * d_model * bytes_per_value


def predicted_cross_rank_share(world_size: int) -> float:
    """Share of dispatched rows that leave their home rank when routing is uniform: ``(w - 1) / w``."""
    return (world_size - 1) / world_size


def check_layer_inputs(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       world_size: int) -> None:
    """A ValueError with the numbers if the layer cannot run on ``world_size`` ranks as given."""
    if placement.ep != world_size or placement.n_experts != cfg.n_experts:
        raise ValueError(f"the placement is for {placement.n_experts} experts on {placement.ep} ranks, but "
                         f"the layer has {cfg.n_experts} experts on {world_size} ranks")
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    check_tokens(x, cfg.d_model, weights.router.dtype)
    split_groups(x.shape[0], world_size)  # every rank needs a token


# -- the same dispatch in one process -----------------------------------------------------------------------------
def simulate_expert_parallel(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                             placement: ExpertPlacement) -> dict:
    """``ep_forward``'s data movement with lists in place of all-to-alls, for any world size.

    Returns the joined output, the send matrix (rows from rank i to rank j) and each rank's expert rows.
    """
    w = placement.ep
    check_layer_inputs(x, weights, cfg, placement, w)
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
        outputs.append(combine(h, r, a, slot_outputs, cfg))
    return {"output": torch.cat(outputs), "send_matrix": [p.rows_to_rank for p in plans],
            "expert_rows": [sum(p.rows_to_rank[dst] for p in plans) for dst in range(w)]}
