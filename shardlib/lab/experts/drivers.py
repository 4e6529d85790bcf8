"""Expert parallelism run on a pool, each run set beside the one-process layer (``moe_reference``:
``dispatch.moe_layer`` with ``ctx=None`` on each capacity group, with its residual). ``ep_forward_on_rank``
is one forward of the layer, its expert phase timed by ``ExpertTimer``; ``run_expert_parallel`` runs it and
reads the gathered results as ``EPRun``; ``run_stall_check``: the skewed layer's stall as one verdict line
(``lab.verdict``).
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.experts.balance import Assignment
from shardlib.core.experts.dispatch import MoEWeights, moe_layer
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig, check_tokens
from shardlib.core.toy import generator
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.runtime.timeline import now_s


def make_tokens(n_tokens: int, d_model: int, seed: int = 1) -> torch.Tensor:
    """``(n_tokens, d_model)`` hidden states of unit variance, reproducible from ``seed``."""
    return torch.randn(whole_number(n_tokens, "n_tokens"), whole_number(d_model, "d_model"), generator=generator(seed))


def token_groups(x: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, ...]:
    """``x`` cut into ``n_groups`` contiguous near-equal groups of rows, as ``torch.tensor_split`` cuts (each
    rank's home tokens are one group, with its own capacity)."""
    if n_groups > x.shape[0]:
        raise ValueError(f"{x.shape[0]} tokens cannot be split into {n_groups} groups: each group (each rank) "
                         f"needs at least one token")
    return x.tensor_split(n_groups)


def check_weights(weights: MoEWeights, cfg: MoEConfig) -> None:
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")


def check_placement(placement: ExpertPlacement, cfg: MoEConfig, world_size: int) -> None:
    if placement.ep != world_size or placement.n_experts != cfg.n_experts:
        raise ValueError(f"the placement is for {placement.n_experts} experts on {placement.ep} ranks, but "
                         f"the layer has {cfg.n_experts} experts on {world_size} ranks")


@dataclass(frozen=True)
class MoEOutput:
    output: torch.Tensor  # (T, d_model), the residual included
    assignment: Assignment  # the groups' assignments one after the other


def moe_reference(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, n_groups: int = 1) -> MoEOutput:
    """The whole layer with its residual in one process. ``n_groups`` contiguous groups get their own
    capacity (the world size, to compare with the layer on ranks: each rank's tokens are one group)."""
    check_weights(weights, cfg)
    parts = [moe_layer(group, weights.router, weights.experts(), cfg) for group in token_groups(x, n_groups)]
    joined = Assignment(*(torch.cat([getattr(p.assignment, f) for p in parts])
                          for f in ("experts", "kept", "rerouted")), parts[0].assignment.capacity)
    return MoEOutput(x + torch.cat([p.output for p in parts]), joined)


# -- on each rank ----------------------------------------------------------------------------------------------
class ExpertTimer:
    """A probe: every phase a span on ``timeline``; the ``experts`` span also carries ``cpu_s`` (CPU time,
    which other programs on the machine do not inflate) and lasts at least ``rows * extra_s_per_row``
    more than the FFNs, and at least ``floor_s`` in all."""

    def __init__(self, timeline, extra_s_per_row: float = 0.0, floor_s: float = 0.0) -> None:
        self.timeline, self.extra_s_per_row, self.floor_s = timeline, extra_s_per_row, floor_s

    def span(self, name: str, kind: str = "compute", **attrs):
        return self._experts(kind, attrs) if name == "experts" else self.timeline.span(name, kind, **attrs)

    @contextmanager
    def _experts(self, kind: str, attrs: dict):
        start_s, cpu_start_s = now_s(), time.process_time()
        yield
        cpu_s = time.process_time() - cpu_start_s
        pad_s = max(attrs.get("rows", 0) * self.extra_s_per_row, start_s + self.floor_s - now_s())
        if pad_s > 0:
            time.sleep(pad_s)
        self.timeline.record("experts", start_s, now_s(), kind, cpu_s=cpu_s, **attrs)


def ep_forward_on_rank(ctx, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       extra_s_per_row: float = 0.0) -> dict:
    """One expert-parallel forward of this rank's contiguous share of ``x`` (the whole batch): the output with
    its residual, the assignment, the rows sent to and received from each rank. Each rank is sent every
    expert's weights and uses only those it hosts; a deployment would load only those."""
    check_placement(placement, cfg, ctx.world_size)
    home = token_groups(x, ctx.world_size)[ctx.rank].to(ctx.device)  # (T_r, d_model)
    out = moe_layer(home, weights.router, weights.experts(placement.hosted(ctx.rank)), cfg, ctx=ctx,
                    placement=placement, probe=ExpertTimer(ctx.timeline, extra_s_per_row))
    return {"output": home + out.output, "assignment": out.assignment, "rows_to_rank": out.rows_to_rank,
            "rows_from_rank": out.rows_from_rank}


# -- what the ranks measured -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class EPRun:
    """One expert-parallel forward on live ranks (``got``: what ``on_ranks`` gathered from
    ``ep_forward_on_rank``), read as the notebook reads it. Per-rank times are medians over the repeats."""

    got: Measured
    cfg: MoEConfig
    weights: MoEWeights
    placement: ExpertPlacement

    @property
    def output(self) -> torch.Tensor:  # (T, d_model), the home ranks' outputs joined in rank order
        return self.got.cat("output")

    @property
    def send_matrix(self) -> list[list[int]]:  # rows sent from rank i (row) to rank j (column)
        return [list(r) for r in self.got.each("rows_to_rank")]

    @property
    def expert_rows(self) -> list[int]:  # rows each rank's experts computed
        return [sum(r) for r in self.got.each("rows_from_rank")]

    @property
    def expert_counts(self) -> torch.Tensor:  # (n_experts,) served token-slots per expert
        return sum(a.counts(self.cfg.n_experts) for a in self.got.each("assignment"))

    dropped_slots = property(lambda self: sum(self.got.each("assignment", lambda a: a.dropped_slots)))
    dropped_tokens = property(lambda self: sum(self.got.each("assignment", lambda a: a.dropped_tokens)))
    rerouted_slots = property(lambda self: sum(self.got.each("assignment", lambda a: a.rerouted_slots)))
    capacity = property(lambda self: self.got.first("assignment").capacity)  # per expert per rank

    def _experts(self, rank: int) -> list:  # the expert phase's span, per repeat
        return [span for i in range(len(self.got.times_s[rank])) for span in self.got.spans("experts", rank, i)]

    def _per_rank(self, read, over=statistics.median) -> list[float]:  # over the repeats, per rank
        return [over(read(s) for s in self._experts(r)) for r in self.got.ranks]

    # wall clock of the expert FFNs (padding included), their CPU seconds (padding excluded), and the least CPU
    # seconds over the repeats (what other work spoils least)
    expert_s = property(lambda self: self._per_rank(lambda s: s.duration_s))
    expert_cpu_s = property(lambda self: self._per_rank(lambda s: s.attrs["cpu_s"]))
    expert_cpu_floor_s = property(lambda self: self._per_rank(lambda s: s.attrs["cpu_s"], min))

    @property
    def forward_s(self) -> list[float]:
        return [statistics.median(self.got.elapsed_s(r)) for r in self.got.ranks]

    @property
    def step_s(self) -> float:  # the last rank's end - the first rank's start
        return statistics.median(self.got.step_s())

    @property
    def waited_for_slowest(self) -> bool:
        """In every repeat, no rank finished before the last rank's experts did."""
        ends = zip(*self.got.times_s)
        expert_ends = zip(*(self._experts(r) for r in self.got.ranks))
        return all(min(e for _, e in per_rank) >= max(s.end_s for s in spans)
                   for per_rank, spans in zip(ends, expert_ends))

    def _all_to_all(self, which: int, wire: bool = False) -> int:
        """Bytes of each rank's ``which``-th all-to-all (0 counts, 1 dispatch, 2 combine), summed."""
        calls = [self.got.records("all_to_all_single", rank) for rank in self.got.ranks]
        return sum(c[which].wire_bytes if wire else c[which].size_bytes for c in calls)

    counts_bytes = property(lambda self: self._all_to_all(0))
    dispatch_bytes = property(lambda self: self._all_to_all(1))  # token rows, summed over ranks
    combine_bytes = property(lambda self: self._all_to_all(2))

    @property
    def weight_bytes(self) -> list[int]:  # the expert weights each rank runs: what it must hold
        return [len(self.placement.hosted(r)) * self.weights.expert_bytes for r in self.got.ranks]

    def wire_bytes_per_token_per_width(self, d_model: int) -> float:
        """Bytes of the token rows sent to other ranks (dispatch and combine) per token per unit of ``d_model``:
        comparable across batch sizes and widths."""
        return (self._all_to_all(1, wire=True) + self._all_to_all(2, wire=True)) / (self.output.shape[0] * d_model)

    @property
    def cross_rank_share(self) -> float:
        total = sum(map(sum, self.send_matrix))
        off = total - sum(self.send_matrix[i][i] for i in range(len(self.send_matrix)))
        return off / total if total else 0.0


def run_expert_parallel(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                        placement: ExpertPlacement | None = None, repeats: int = 1,
                        extra_s_per_row: float = 0.0) -> EPRun:
    """Check the inputs here (a clear ``ValueError`` before any rank is involved), then run
    ``ep_forward_on_rank`` on every rank of ``ranks``, ``repeats`` times."""
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size) if placement is None else placement
    check_placement(placement, cfg, ranks.world_size)
    check_weights(weights, cfg)
    check_tokens(x, cfg.d_model, weights.router.dtype)
    token_groups(x, ranks.world_size)  # every rank needs a token
    whole_number(repeats, "repeats")
    number_at_least(extra_s_per_row, "extra_s_per_row (seconds)")
    got = on_ranks(ranks, ep_forward_on_rank, x, weights, cfg, placement, extra_s_per_row, repeats=repeats)
    return EPRun(got, cfg, weights, placement)


# -- the stall, as a verdict -------------------------------------------------------------------------------------
STALL_BAND = (0.65, 1.15)  # CPU ratio over rows ratio: fixed per-call work and padding pull it a little under 1


@dataclass(frozen=True)
class StallCheck:
    """The layer at skew 0 and skew 1 (``runs[skew]``), the busiest (``slow``) and the least busy rank
    (``fast``) at skew 1, and the verdict: the busiest rank's expert CPU time over the other's, predicted
    by their rows."""

    runs: dict
    verdicts: tuple[Verdict, ...]
    slow: int
    fast: int


def _busiest(run: EPRun) -> tuple[int, int]:
    rows = run.expert_rows
    return rows.index(max(rows)), rows.index(min(rows))


def stall_verdicts(runs: dict) -> tuple[Verdict, ...]:
    """At skew 1: the CPU time of the busiest rank's experts over the least busy rank's (each rank's least
    over the repeats: a burst of other work only adds), predicted as the ratio of their rows, held within
    ``STALL_BAND``."""
    r, (slow, fast) = runs[1.0], _busiest(runs[1.0])
    return (Verdict(f"rank {slow}'s expert CPU time over rank {fast}'s, skew 1",
                    r.expert_rows[slow] / r.expert_rows[fast],
                    r.expert_cpu_floor_s[slow] / r.expert_cpu_floor_s[fast], "", *STALL_BAND),)


def run_stall_check(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, repeats: int = 7) -> StallCheck:
    """The layer at skew 0 and skew 1 on ``ranks``, ``repeats`` times each after one warm-up, measured again
    (at most three times) until the busiest rank's CPU time follows its rows. Every rank waits for the
    busiest in the combine (``EPRun.waited_for_slowest``); that part is exact, not a timing."""
    run_expert_parallel(ranks, x, weights, cfg)  # warm-up
    runs, verdicts = verified(lambda: {skew: run_expert_parallel(ranks, x, weights, cfg.but(skew=skew), repeats=repeats)
                                       for skew in (0.0, 1.0)}, stall_verdicts)
    return StallCheck(runs, verdicts, *_busiest(runs[1.0]))
