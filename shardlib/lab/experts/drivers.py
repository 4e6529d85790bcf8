"""Expert parallelism run on a pool: one forward gathered (``run_expert_parallel``), and the
load-imbalance knob against each mitigation (``run_moe_policy``, ``run_mitigation``, ``run_mitigations``),
each run compared with the single-process layer under the same policy. ``run_stall_check``: the skewed
layer's stall as a learner reads it, one verdict line (``lab.verdict``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from shardlib.core.checks import number_at_least, whole_number
from shardlib.core.experts.dispatch import MoEWeights
from shardlib.core.experts.placement import ExpertPlacement, replicate_hottest
from shardlib.core.experts.routing import MoEConfig
from shardlib.lab.experts.balance import MITIGATIONS, LoadStats, load_stats, mitigated
from shardlib.lab.experts.ranks import ep_forward_on_rank
from shardlib.lab.experts.reference import MoEOutput, check_layer_inputs, moe_reference, reference_for
from shardlib.lab.gather import gather
from shardlib.lab.verdict import Verdict, verified


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
    rows_wire_bytes: int = 0  # token rows sent to other ranks, dispatch and combine, summed over ranks
    expert_cpu_floor_s: tuple[float, ...] = ()  # per rank, the least over repeats: what other work spoils least

    def wire_bytes_per_token_per_width(self, d_model: int) -> float:
        """``rows_wire_bytes`` per token per unit of ``d_model``: comparable across batch sizes and widths."""
        return self.rows_wire_bytes / (self.output.shape[0] * d_model)

    @property
    def cross_rank_share(self) -> float:
        total = sum(map(sum, self.send_matrix))
        off = total - sum(self.send_matrix[i][i] for i in range(len(self.send_matrix)))
        return off / total if total else 0.0


def run_expert_parallel(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                        placement: ExpertPlacement | None = None, repeats: int = 1,
                        extra_s_per_row: float = 0.0) -> EPRun:
    """Check the inputs here (a clear ``ValueError`` before any rank is involved), run
    ``ep_forward_on_rank`` on every rank of ``ranks``, and gather the results."""
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size) if placement is None else placement
    check_layer_inputs(x, weights, cfg, placement, ranks.world_size)
    whole_number(repeats, "repeats")
    number_at_least(extra_s_per_row, "extra_s_per_row (seconds)")
    got = gather(ranks.run(ep_forward_on_rank, x, weights, cfg, placement, repeats, extra_s_per_row))
    steps = [end - start for end, start in zip(got.across("end_s", max), got.across("start_s", min))]
    waited = all(first_end >= last_experts for first_end, last_experts in
                 zip(got.across("end_s", min), got.across("expert_end_s", max)))
    median = statistics.median
    return EPRun(
        output=got.cat("output"), send_matrix=list(got.each("rows_to_rank")), expert_rows=list(got.each("expert_rows")),
        expert_counts=got.sum("expert_counts"), dropped_slots=got.sum("dropped_slots"),
        dropped_tokens=got.sum("dropped_tokens"), rerouted_slots=got.sum("rerouted_slots"),
        capacity=got.first("capacity"), expert_s=list(got.each("expert_s", median)),
        expert_cpu_s=list(got.each("expert_cpu_s", median)), forward_s=list(got.each("forward_s", median)),
        step_s=median(steps), waited_for_slowest=waited, weight_bytes=list(got.each("weight_bytes")),
        dispatch_bytes=got.sum("dispatch_bytes"), combine_bytes=got.sum("combine_bytes"),
        counts_bytes=got.sum("counts_bytes"), placement=placement, rows_wire_bytes=got.sum("rows_wire_bytes"),
        expert_cpu_floor_s=got.each("expert_cpu_s", min))


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
    expert_load: LoadStats
    rank_load: LoadStats
    tokens_changed: int  # tokens whose output differs from the uncapped layer's
    max_output_change: float
    exact: bool

    @property
    def expert_max_over_mean(self) -> float:
        return self.expert_load.max_over_mean

    @property
    def rank_max_over_mean(self) -> float:
        return self.rank_load.max_over_mean

    @property
    def busiest_expert_cpu_s(self) -> float:
        return max(self.run.expert_cpu_s)


def run_moe_policy(ranks, x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, replicate: bool = False,
                   repeats: int = 3, uncapped: MoEOutput | None = None, label: str = "") -> PolicyRun:
    """Run the layer with ``cfg``'s routing policy on ``ranks`` (with a second copy of the hottest expert
    when ``replicate``), and measure it against the uncapped layer on the same tokens (``uncapped``,
    computed here unless given). Replication is planned from the uncapped expert loads (in practice,
    from recent batches)."""
    plain = cfg.but(capacity_factor=None, reroute=False)
    with ranks.same_threads():  # references computed as a rank computes, so "exact" means bit for bit
        uncapped = moe_reference(x, weights, plain) if uncapped is None else uncapped
        same_policy = uncapped if cfg == plain else reference_for(x, weights, cfg, ranks.world_size)
    placement = ExpertPlacement(cfg.n_experts, ranks.world_size)
    if replicate:
        placement = replicate_hottest(placement, uncapped.counts(cfg.n_experts))
    run = run_expert_parallel(ranks, x, weights, cfg, placement, repeats=repeats)
    change = (run.output - uncapped.output).abs().max(dim=1).values  # (T,) per token
    slots = x.shape[0] * cfg.k
    return PolicyRun(label, cfg, run, load_stats(run.expert_counts, total=slots),
                     load_stats(run.expert_rows, total=slots), int((change > 0).sum()), float(change.max()),
                     torch.equal(run.output, same_policy.output))


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
    slow: int
    fast: int
    verdicts: tuple[Verdict, ...]

    @property
    def rows_ratio(self) -> float:
        r = self.runs[1.0]
        return r.expert_rows[self.slow] / r.expert_rows[self.fast]

    @property
    def cpu_ratio(self) -> float:
        r = self.runs[1.0]
        return r.expert_cpu_floor_s[self.slow] / r.expert_cpu_floor_s[self.fast]


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
    slow, fast = _busiest(runs[1.0])
    return StallCheck(runs, slow, fast, verdicts)
