"""The layout planner: every (tp, pp, dp, ep) of a model on a cluster, the feasible ones scored and ranked.

``plan_serving(model, cluster, workload, objective)`` enumerates every ``Layout`` with ``tp x pp x dp`` = the
cluster's GPUs (and, for MoE models, every ``ep``), rejects those that break a rule of ``memory`` (with
the reason), scores the rest with ``decode`` and ranks them: ``"throughput"`` (decode tokens per second
for the cluster, each replica with the batch its memory affords) or ``"latency"`` (time between two
tokens of one request). Every ranked score carries its reasons (``reasons``); the plan adds why its
best beat the runner-up. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import choice
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, Rejected
from shardlib.facts.hardware import Cluster
from shardlib.predict.serving.decode import Score, score
from shardlib.predict.serving.memory import Workload, layout_problems
from shardlib.predict.serving.reasons import counterpart_reason, kind, own_reasons
from shardlib.predict.units import ms

OBJECTIVES = ("throughput", "latency")


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    objective: str
    ranked: tuple[Score, ...]  # best first
    rejected: tuple[Rejected, ...]
    reasons: tuple[str, ...] = ()  # why the best won
    kernel_efficiency: float = 1.0  # the share of peak the times assume (1.0: floors)

    @property
    def best(self) -> Score | None:
        return self.ranked[0] if self.ranked else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(model: ModelConfig, n_gpus: int) -> list[Layout]:
    """Every (tp, pp, dp) with tp x pp x dp = n_gpus, and for MoE models every ep dividing n_experts."""
    out = []
    for tp in _divisors(n_gpus):
        for pp in _divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            eps = [e for e in _divisors(tp * dp) if model.n_experts % e == 0] if model.is_moe else [1]
            out += [Layout(tp, pp, dp, ep) for ep in eps]
    return out


def objective_workload(workload: Workload, objective: str) -> Workload:
    """The workload a ranking uses: for latency, one sequence per replica unless a batch is fixed."""
    return replace(workload, batch=1) if objective == "latency" and not workload.batch else workload


def _value(s: Score, objective: str) -> str:
    return f"{s.tokens_per_s:,.0f} tokens/s" if objective == "throughput" else f"{ms(s.decode_step_s)} per token"


def _plan_reasons(objective: str, workload: Workload, ranked: list[Score], cluster: Cluster) -> tuple[str, ...]:
    if not ranked:
        return ("no layout fits: every one breaks a rule below",)
    best = ranked[0]
    out = []
    if objective == "latency" and not workload.batch:
        out.append("ranked by latency with one sequence per replica: what a user waits per token when the server "
                   "is not busy (fix Workload(batch=...) to rank a loaded server)")
    if len(ranked) > 1:
        second = ranked[1]
        if objective == "throughput":
            margin = f"{best.tokens_per_s / second.tokens_per_s:.2f}x the tokens of"
        else:
            margin = f"{second.decode_step_s / best.decode_step_s:.2f}x faster than"
        out.append(f"best for {objective}: {best.layout.label} ({kind(best.layout, cluster)}), "
                   f"{_value(best, objective)}, "
                   f"{margin} the next, {second.layout.label} ({_value(second, objective)})")
    else:
        out.append(f"best for {objective}: {best.layout.label}, the only layout that fits")
    return tuple(out)


def plan_serving(model: ModelConfig, cluster: Cluster, workload: Workload | None = None,
                 objective: str = "throughput") -> Plan:
    """Every layout of ``model`` on ``cluster``: the feasible ones ranked by ``objective`` (highest
    decode throughput, or lowest decode latency per token; ties go to the other, then to fewer model
    splits), each with its reasons, and the rest with theirs. Training layouts are
    ``predict.training.planner.plan_training``'s."""
    choice(objective, OBJECTIVES, "objective")
    workload = Workload() if workload is None else workload
    if not isinstance(workload, Workload):
        raise ValueError(f"plan_serving ranks serving layouts and needs a Workload, got {type(workload).__name__} "
                         "(plan_training ranks training layouts for a TrainingWorkload)")
    work = objective_workload(workload, objective)
    scored, rejected = {}, []
    for layout in enumerate_layouts(model, cluster.n_gpus):
        problems = layout_problems(model, cluster, layout, work)
        if problems:
            rejected.append(Rejected(layout, tuple(problems)))
        else:
            scored[layout] = score(model, cluster, layout, work)
    ranked = []
    for s in scored.values():
        extra = counterpart_reason(model, cluster, work, s, scored)
        ranked.append(replace(s, reasons=own_reasons(model, cluster, work, s) + ((extra,) if extra else ())))

    def key(s: Score):
        splits = s.layout.tp * s.layout.pp
        if objective == "throughput":
            return (-round(s.tokens_per_s, 6), s.decode_step_s, splits)
        return (round(s.decode_step_s, 12), -s.tokens_per_s, splits)

    ranked.sort(key=key)
    return Plan(model.name, cluster.name, objective, tuple(ranked), tuple(rejected),
                _plan_reasons(objective, workload, ranked, cluster), workload.kernel_efficiency)
