"""Expert parallelism run on a pool, each run set beside the one-process layer (``moe_reference``:
``dispatch.moe_layer`` with ``ctx=None`` on each capacity group, with its residual). ``run_expert_parallel``:
one forward gathered; ``run_moe_policy``, ``run_mitigation``, ``run_mitigations``: the load-imbalance knob
against each mitigation; ``run_stall_check``: the skewed layer's stall as one verdict line (``lab.verdict``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.experts.balance import Assignment, split_groups
from shardlib.core.experts.dispatch import MoEWeights, moe_layer
from shardlib.core.experts.placement import ExpertPlacement
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.toy import generator
from shardlib.lab.experts.balance import MITIGATIONS, load_stats, mitigated, replicate_hottest
from shardlib.lab.experts.ranks import check_layer_inputs, ep_forward_on_rank
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified


def make_tokens(n_tokens: int, d_model: int, seed: int = 1) -> torch.Tensor:
    """``(n_tokens, d_model)`` hidden states of unit variance, reproducible from ``seed``."""
    return torch.randn(whole_number(n_tokens, "n_tokens"), whole_number(d_model, "d_model"), generator=generator(seed))


@dataclass(frozen=True)
class MoEOutput:
    output: torch.Tensor  # (T, d_model), the residual included
    assignment: Assignment  # the groups' assignments one after the other

    def counts(self, n_experts: int) -> torch.Tensor:
        return self.assignment.counts(n_experts)


def moe_reference(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, n_groups: int = 1) -> MoEOutput:
    """The whole layer with its residual in one process. ``n_groups`` contiguous groups get their own
    capacity (the world size, to compare with the layer on ranks: each rank's tokens are one group)."""
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    parts = [moe_layer(x[a:b], weights.router, weights.experts(), cfg) for a, b in split_groups(x.shape[0], n_groups)]
    joined = Assignment(*(torch.cat([getattr(p.assignment, f) for p in parts])
                          for f in ("experts", "kept", "rerouted")), parts[0].assignment.capacity)
    return MoEOutput(x + torch.cat([p.output for p in parts]), joined)


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
    check_layer_inputs(x, weights, cfg, placement, ranks.world_size)
    whole_number(repeats, "repeats")
    number_at_least(extra_s_per_row, "extra_s_per_row (seconds)")
    got = on_ranks(ranks, ep_forward_on_rank, x, weights, cfg, placement, extra_s_per_row, repeats=repeats)
    return EPRun(got, cfg, weights, placement)


# -- the knob against the mitigations -----------------------------------------------------------------------------
@dataclass(frozen=True)
class PolicyRun:
    """One live run of a routing policy (``cfg``, and whether the hottest expert was replicated): the
    run itself, the loads against their even share (every requested token-slot counted, dropped ones
    included: see ``load_stats``), how the outputs moved against the uncapped layer, and whether the run
    equals the single-process layer under the same policy bit for bit."""

    label: str
    cfg: MoEConfig
    run: EPRun
    tokens_changed: int  # tokens whose output differs from the uncapped layer's
    exact: bool

    slots = property(lambda self: self.run.output.shape[0] * self.cfg.k)  # every requested token-slot
    expert_load = property(lambda self: load_stats(self.run.expert_counts, total=self.slots))
    rank_load = property(lambda self: load_stats(self.run.expert_rows, total=self.slots))
    expert_max_over_mean = property(lambda self: self.expert_load.max_over_mean)
    rank_max_over_mean = property(lambda self: self.rank_load.max_over_mean)


def run_moe_policy(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, replicate: bool = False,
                   repeats: int = 3, uncapped: MoEOutput | None = None, label: str = "") -> PolicyRun:
    """Run the layer with ``cfg``'s routing policy on ``ranks`` (with a second copy of the hottest expert
    when ``replicate``), and measure it against the uncapped layer on the same tokens (``uncapped``,
    computed here unless given). Replication is planned from the uncapped expert loads (in practice,
    from recent batches)."""
    plain = cfg.but(capacity_factor=None, reroute=False)
    with ranks.same_threads():  # references computed as a rank computes, so "exact" means bit for bit
        uncapped = moe_reference(x, weights, plain) if uncapped is None else uncapped
        same_policy = uncapped if cfg == plain else moe_reference(x, weights, cfg, ranks.world_size)
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size)
    if replicate:
        placement = replicate_hottest(placement, uncapped.counts(cfg.n_experts))
    run = run_expert_parallel(ranks, x, weights, cfg, placement, repeats=repeats)
    change = (run.output - uncapped.output).abs().max(dim=1).values  # (T,) per token
    return PolicyRun(label, cfg, run, int((change > 0).sum()), torch.equal(run.output, same_policy.output))


def run_mitigation(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, mitigation: str,
                   capacity_factor: float = 1.25, repeats: int = 3, uncapped: MoEOutput | None = None) -> PolicyRun:
    """``run_moe_policy`` with one of ``MITIGATIONS`` applied to ``cfg``."""
    return run_moe_policy(ranks, x, weights, mitigated(cfg, mitigation, capacity_factor),
                          mitigation == "replicate hottest", repeats, uncapped, mitigation)


@dataclass(frozen=True)
class Mitigations:
    """One ``PolicyRun`` per mitigation, in the order run; ``mitigations["capacity"]`` picks one by label."""

    runs: tuple[PolicyRun, ...]

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(r.label for r in self.runs)

    def __getitem__(self, label: str) -> PolicyRun:
        for r in self.runs:
            if r.label == label:
                return r
        raise KeyError(f"no run labelled {label!r}; these were run: {', '.join(self.labels)}")


def run_mitigations(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, mitigations=MITIGATIONS,
                    capacity_factor: float = 1.25, repeats: int = 3) -> Mitigations:
    """``run_mitigation`` for each of ``mitigations``, sharing one uncapped reference."""
    with ranks.same_threads():
        uncapped = moe_reference(x, weights, cfg.but(capacity_factor=None, reroute=False))
    return Mitigations(tuple(run_mitigation(ranks, x, weights, cfg, m, capacity_factor, repeats, uncapped)
                             for m in mitigations))


# -- the stall, as a verdict -------------------------------------------------------------------------------------
STALL_BAND = (0.65, 1.15)  # CPU ratio over rows ratio: fixed per-call work and padding pull it a little under 1


@dataclass(frozen=True)
class StallCheck:
    """The layer at skew 0 and skew 1 (``runs[skew]``), the busiest and the least busy rank at skew 1, and
    the verdict: the busiest rank's expert CPU time over the other's, predicted by their rows."""

    runs: dict
    verdicts: tuple[Verdict, ...]

    slow = property(lambda self: _busiest(self.runs[1.0])[0])  # the rank with the most rows
    fast = property(lambda self: _busiest(self.runs[1.0])[1])  # the rank with the fewest


def _busiest(run: EPRun) -> tuple[int, int]:
    rows = run.expert_rows
    return max(range(len(rows)), key=rows.__getitem__), min(range(len(rows)), key=rows.__getitem__)


def stall_verdicts(runs: dict) -> tuple[Verdict, ...]:
    """At skew 1: the CPU time of the busiest rank's experts over the least busy rank's (each rank's least
    over the repeats: a burst of other work only adds), predicted as the ratio of their rows, held within
    ``STALL_BAND``."""
    slow, fast = _busiest(runs[1.0])
    r = runs[1.0]
    low, high = STALL_BAND
    return (Verdict(f"rank {slow}'s expert CPU time over rank {fast}'s, skew 1",
                    r.expert_rows[slow] / r.expert_rows[fast],
                    r.expert_cpu_floor_s[slow] / r.expert_cpu_floor_s[fast], "", low, high),)


def run_stall_check(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, repeats: int = 7) -> StallCheck:
    """The layer at skew 0 and skew 1 on ``ranks``, ``repeats`` times each after one warm-up, measured again
    (at most three times) until the busiest rank's CPU time follows its rows. Every rank waits for the
    busiest in the combine (``EPRun.waited_for_slowest``); that part is exact, not a timing."""
    run_expert_parallel(ranks, x, weights, cfg)  # warm-up
    runs, verdicts = verified(lambda: {skew: run_expert_parallel(ranks, x, weights, cfg.but(skew=skew), repeats=repeats)
                                       for skew in (0.0, 1.0)}, stall_verdicts)
    return StallCheck(runs, verdicts)
