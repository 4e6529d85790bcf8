"""The layout planner: every (tp, pp, dp, ep) of a model on a cluster, the feasible ones scored and ranked.

``plan_serving(model, cluster, workload, objective)`` enumerates every ``Layout`` with ``tp x pp x dp`` = the
cluster's GPUs (and, for MoE models, every ``ep``), rejects those that break a rule of ``memory`` (with
the reason), scores the rest with ``decode`` and ranks them: ``"throughput"`` (decode tokens per second
for the cluster, each replica with the batch its memory affords) or ``"latency"`` (time between two
tokens of one request) or ``"first_token"`` (one prompt alone through the layout: the prefill's TTFT).
``plan_pools`` plans a prefill pool and a decode pool each on its own (DistServe, Zhong et al. 2024): the
prefill pool for its first token, the decode pool for throughput. ``ui.serving_reasons`` says why in words.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import choice
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, Rejected
from shardlib.facts.hardware import Cluster
from shardlib.predict.serving.decode import Score, score
from shardlib.predict.serving.memory import Workload, layout_problems
from shardlib.predict.shapes import divisors

OBJECTIVES = ("throughput", "latency", "first_token")


@dataclass(frozen=True)
class Plan:
    """The layouts of ``model`` on ``cluster`` for ``workload`` (as given; ``objective_workload`` is the one
    ranked): the feasible ones best first, the rest with their reasons."""

    model: ModelConfig
    cluster: Cluster
    workload: Workload
    objective: str
    ranked: tuple[Score, ...]  # best first
    rejected: tuple[Rejected, ...]

    @property
    def best(self) -> Score | None:
        return self.ranked[0] if self.ranked else None


def enumerate_layouts(model: ModelConfig, n_gpus: int) -> list[Layout]:
    """Every (tp, pp, dp) with tp x pp x dp = n_gpus, and for MoE models every ep dividing n_experts."""
    out = []
    for tp in divisors(n_gpus):
        for pp in divisors(n_gpus // tp):
            dp = n_gpus // (tp * pp)
            eps = [e for e in divisors(tp * dp) if model.n_experts % e == 0] if model.is_moe else [1]
            out += [Layout(tp, pp, dp, ep) for ep in eps]
    return out


def objective_workload(workload: Workload, objective: str) -> Workload:
    """The workload a ranking uses: for latency, one sequence per replica unless a batch is fixed."""
    return replace(workload, batch=1) if objective == "latency" and not workload.batch else workload


def plan_serving(model: ModelConfig, cluster: Cluster, workload: Workload | None = None,
                 objective: str = "throughput") -> Plan:
    """Every layout of ``model`` on ``cluster``: the feasible ones ranked by ``objective`` (highest
    decode throughput, lowest decode latency per token, or soonest first token; ties go to the others,
    then to fewer model splits), and the rest with their reasons. Training layouts are
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

    def key(s: Score):
        splits = s.layout.tp * s.layout.pp
        if objective == "throughput":
            return (-round(s.tokens_per_s, 6), s.decode_step_s, splits)
        if objective == "first_token":
            return (round(s.first_token_s, 12), -s.tokens_per_s, splits)
        return (round(s.decode_step_s, 12), -s.tokens_per_s, splits)

    return Plan(model, cluster, workload, objective, tuple(sorted(scored.values(), key=key)), tuple(rejected))


@dataclass(frozen=True)
class PoolPlan:
    """A prefill pool's plan, ranked by first token, and a decode pool's, ranked by throughput."""

    prefill: Plan
    decode: Plan


def plan_pools(model: ModelConfig, prefill_cluster: Cluster, decode_cluster: Cluster,
               workload: Workload | None = None) -> PoolPlan:
    """Each pool's layout chosen on its own (DistServe, Zhong et al. 2024): prefill is compute-bound and
    wants its one prompt's first token soonest, decode wants the most tokens a second from its batch."""
    return PoolPlan(plan_serving(model, prefill_cluster, workload, "first_token"),
                    plan_serving(model, decode_cluster, workload, "throughput"))
