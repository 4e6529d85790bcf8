"""The training planner: every (tp, pp, dp, cp, ep, ZeRO stage) of a model on a cluster, ranked by tokens/s.

For an MoE model ``ep`` runs over every divisor of its experts that divides a stage's ``tp x dp x cp`` ranks
(expert data parallelism: ``memory`` and ``time_model`` say what it keeps and sends); a dense model has
``ep = 1`` only, and plans exactly as without it.

``plan_training`` first prunes the values of one axis that no layout
may use (tp across nodes or past the heads, a ring slice that is not whole, more stages than layers, a
global batch that does not split over the replicas), then, for each layout left and each ZeRO stage,
tries every microbatch size and recomputation the workload allows: a configuration is rejected when the
fullest stage's memory (``training_memory``) passes the usable memory, and the fastest that fits is the
layout's score (``training``). Ties (within 0.1%) go to fewer model splits, then the lower ZeRO stage. Each score
carries its reasons; the plan says why the best beat the runner-up and what its neighbours (fewer stages,
less tp, no ring) would give. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import DP_STRATEGIES, Layout, Rejected
from shardlib.core.pipeline.registry import schedule_spec
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import Cluster
from shardlib.predict.shapes import divisors, tensor_parallel_problems
from shardlib.predict.training.memory import expert_dp
from shardlib.predict.training.time_model import TrainingScore, TrainingWorkload, score_training
from shardlib.predict.units import gb, seconds

# A step's terms, in TrainingScore's order (its field -> in words).
TERM_NAMES = {"compute_s": "compute", "bubble_s": "pipeline bubble", "tp_s": "tp collectives",
              "cp_s": "ring K/V not hidden", "dp_s": "gradient sync not hidden", "pp_s": "stage hops",
              "ep_s": "expert all-to-alls"}


@dataclass(frozen=True)
class TrainingPlan:
    """The ranked scores (best first), the rejected layouts with their numbers, the pruned axis values,
    and why the best won."""

    model: str
    cluster: str
    workload: TrainingWorkload
    ranked: tuple[TrainingScore, ...]
    rejected: tuple[Rejected, ...]
    pruned: tuple[str, ...]
    reasons: tuple[str, ...] = ()

    @property
    def best(self) -> TrainingScore | None:
        return self.ranked[0] if self.ranked else None


def _pp_problem(model: ModelConfig, pp: int, workload: TrainingWorkload, chunks: int) -> str:
    """Why ``pp`` stages cannot hold ``model`` (empty: they can): too few layers, or too few per chunk."""
    if pp > model.n_layers:
        return f"pp = {pp}: more stages than the {model.n_layers} layers"
    try:
        fewest = min(stage_layer_counts(model.n_layers, pp, end_layers=int(workload.lighter_ends)))
    except ValueError as err:
        return f"pp = {pp}: {err}"
    if pp > 1 and fewest < chunks:
        return f"pp = {pp}: its stages of {fewest} layers cannot hold {chunks} model chunks each ({workload.schedule})"
    return ""


def axis_values(model: ModelConfig, cluster: Cluster, workload: TrainingWorkload) -> tuple[dict, list[str]]:
    """The values each axis may take on ``cluster`` (``{"tp": [...], ...}``), and why the others may not."""
    n, g, pruned = cluster.n_gpus, cluster.gpus_per_node, []
    chunks = schedule_spec(workload.schedule).n_chunks(workload.chunks)  # model chunks per stage (1: 1F1B)
    values = {"tp": [], "cp": [], "pp": [], "dp": []}
    for d in divisors(n):
        if d > g or g % d:
            pruned.append(f"tp = {d}: its groups would cross nodes of {g} GPUs (tp stays inside a node)")
        elif tensor_parallel_problems(model, d, copy_kv_heads=False):
            pruned.append(f"tp = {d}: " + "; ".join(tensor_parallel_problems(model, d, copy_kv_heads=False)))
        else:
            values["tp"].append(d)
        if workload.sequence_tokens % d:
            pruned.append(f"cp = {d}: {workload.sequence_tokens:,} tokens do not split into {d} equal ring slices")
        elif d > 1 and workload.sequence_tokens // d < workload.min_ring_slice_tokens:
            pruned.append(f"cp = {d}: ring slices of {workload.sequence_tokens // d:,} tokens, shorter than "
                          f"min_ring_slice_tokens = {workload.min_ring_slice_tokens:,}")
        else:
            values["cp"].append(d)
        problem = _pp_problem(model, d, workload, chunks)
        if problem:
            pruned.append(problem)
        else:
            values["pp"].append(d)
        if workload.sequences % d:
            pruned.append(f"dp = {d}: {workload.sequences:,} sequences per step do not split over {d} replicas")
        else:
            values["dp"].append(d)
    return values, pruned


def best_configuration(model: ModelConfig, cluster: Cluster, layout: Layout,
                       workload: TrainingWorkload) -> TrainingScore | Rejected:
    """The fastest microbatch size and recomputation of ``layout`` that fits, or why none does."""
    w = workload
    usable, per_replica = w.usable_bytes(cluster), w.sequences // layout.dp
    best, tightest = None, None
    for b in w.microbatch_sizes:
        if per_replica % b:
            continue
        for rec in w.recompute:
            mem = w.memory(model, layout, b, per_replica // b, rec)
            if mem.total_bytes > usable:
                if tightest is None or mem.total_bytes < tightest[0].total_bytes:
                    tightest = (mem, b, rec)
                continue
            s = score_training(model, cluster, layout, w, b, rec, mem)
            if best is None or s.tokens_per_s > best.tokens_per_s:
                best = s
    if best is not None:
        return best
    if tightest is None:
        return Rejected(layout, (f"no microbatch size of {w.microbatch_sizes} divides the {per_replica} sequences "
                                 "per replica",))
    mem, b, rec = tightest
    total = gb(cluster.memory_per_gpu_bytes)
    return Rejected(layout, (f"needs {gb(mem.total_bytes)} per GPU on stage {mem.stage} ({gb(mem.states_bytes)} of "
                             f"weights, gradients and optimizer state + {gb(mem.activations_bytes + mem.ends_bytes)} "
                             f"of activations, {mem.in_flight:g} microbatch{'es' if mem.in_flight != 1 else ''} in "
                             f"flight) but {gb(usable)} is usable ({usable / cluster.memory_per_gpu_bytes:.0%} of "
                             f"{total}), even at microbatch {b} with {rec} recomputation",))


def rank(scores: list[TrainingScore], tie: float = 1e-3) -> list[TrainingScore]:
    """Fastest first; scores within ``tie`` (0.1%) of a group's fastest are a tie, ordered by fewer model
    splits (tp x pp x cp), then the lower ZeRO stage, then the smaller ep."""
    rest, out = sorted(scores, key=lambda s: -s.tokens_per_s), []
    while rest:
        group = [s for s in rest if s.tokens_per_s >= rest[0].tokens_per_s * (1 - tie)]
        rest = rest[len(group):]
        out += sorted(group, key=lambda s: (s.layout.tp * s.layout.pp * s.layout.cp,
                                            DP_STRATEGIES.index(s.layout.dp_strategy), s.layout.ep))
    return out


def own_reasons(s: TrainingScore, cluster: Cluster, workload: TrainingWorkload) -> tuple[str, ...]:
    """Where ``s``'s memory and time go, in words."""
    lay, mem = s.layout, s.memory
    sp = ", sequence parallel" if workload.sequence_parallel and lay.tp > 1 else ""
    experts = (f"; {mem.expert_params / 1e9:.2f} B expert parameters, {lay.ep}-way expert parallel, each expert "
               f"kept by {expert_dp(lay)} ranks" if lay.ep > 1 else "")
    memory = (f"memory: {gb(mem.total_bytes)} of {gb(workload.usable_bytes(cluster))} usable on stage {mem.stage}: "
              f"{gb(mem.states_bytes)} of states (Megatron-LM's 18 bytes per parameter, {lay.dp_strategy} over "
              f"dp x cp = {lay.dp * lay.cp}{experts}), {gb(mem.activations_bytes + mem.ends_bytes)} of activations "
              f"({mem.in_flight:g} microbatch{'' if mem.in_flight == 1 else 'es'} of {s.microbatch} x "
              f"{workload.sequence_tokens // lay.cp:,} tokens in flight, {s.recompute} recomputation{sp})")
    terms = " + ".join(f"{TERM_NAMES[t]} {seconds(getattr(s, t))}" for t in TERM_NAMES if getattr(s, t) > 0)
    time = (f"step: {terms} = {seconds(s.step_s)} for {workload.global_batch_tokens:,} tokens ({s.microbatch} x "
            f"{s.n_microbatches} microbatch{'' if s.n_microbatches == 1 else 'es'} x dp {lay.dp}): "
            f"{s.tokens_per_s:,.0f} tokens/s, MFU {s.mfu:.0%}")
    return memory, time


def _versus(best: TrainingScore, other: TrainingScore) -> str:
    """How ``other`` compares with ``best``: the ratio, and the term that grows most."""
    worst = max(TERM_NAMES, key=lambda t: getattr(other, t) - getattr(best, t))
    gap = getattr(other, worst) - getattr(best, worst)
    return (f"{other.layout.label} ({other.recompute} recomputation, microbatch {other.microbatch}): "
            f"{other.tokens_per_s / best.tokens_per_s:.2f}x the tokens/s, mostly {TERM_NAMES[worst]} "
            f"(+{seconds(gap)} a step)")


def neighbours(layout: Layout) -> list[Layout]:
    """The layouts one step away that move GPUs into data parallelism: half the stages, half the tp, half
    the ring; and, with experts spread, half the ep."""
    out = []
    for axis in ("pp", "tp", "cp"):
        v = getattr(layout, axis)
        if v > 1 and v % 2 == 0:
            out.append(replace(layout, **{axis: v // 2, "dp": layout.dp * 2}))
    if layout.ep > 1 and layout.ep % 2 == 0:
        out.append(replace(layout, ep=layout.ep // 2))
    return [o if o.dp * o.cp > 1 else replace(o, dp_strategy="ddp") for o in out]


def plan_reasons(ranked: list[TrainingScore], rejected: dict, pruned: list[str], scored: dict) -> tuple[str, ...]:
    if not ranked:
        return ("no layout fits: every one breaks a rule below",)
    best, out = ranked[0], []
    if len(ranked) > 1:
        second = ranked[1]
        if second.tokens_per_s >= best.tokens_per_s * (1 - 1e-3):
            out.append(f"best: {best.layout.label}, {best.tokens_per_s:,.0f} tokens/s, tied (within 0.1%) with "
                       f"{second.layout.label}: the tie goes to fewer model splits (tp x pp x cp), then the lower "
                       "ZeRO stage")
        else:
            out.append(f"best: {best.layout.label}, {best.tokens_per_s:,.0f} tokens/s; runner-up "
                       + _versus(best, second))
    for other in neighbours(best.layout):
        if other in scored:
            out.append("one step away, " + _versus(best, scored[other]))
        elif other in rejected:
            out.append(f"one step away, {other.label} is ruled out: {rejected[other].reasons[0]}")
        else:
            changed = [a for a in ("pp", "tp", "cp", "dp", "ep") if getattr(other, a) != getattr(best.layout, a)]
            why = [p for p in pruned if any(p.startswith(f"{a} = {getattr(other, a)}:") for a in changed)]
            out.append(f"one step away, {other.label} is not allowed: {why[0] if why else 'not enumerated'}")
    return tuple(out)


def expert_degrees(model: ModelConfig, stage_ranks: int) -> list[int]:
    """The ep a stage of ``stage_ranks`` ranks may use: 1 for a dense model; for an MoE model every ep that
    divides both its experts (whole experts per rank) and the stage's ranks."""
    if not model.is_moe:
        return [1]
    return [e for e in divisors(stage_ranks) if model.n_experts % e == 0]


def plan_training(model: ModelConfig, cluster: Cluster,
                  workload: TrainingWorkload = TrainingWorkload()) -> TrainingPlan:
    """Every layout of ``model`` training on ``cluster``: pruned, rejected with numbers, or scored and ranked
    by tokens per second (the module docstring)."""
    if not isinstance(workload, TrainingWorkload):
        raise ValueError("plan_training needs a TrainingWorkload(sequence_tokens=..., "
                         f"global_batch_tokens=...), got {type(workload).__name__}")
    values, pruned = axis_values(model, cluster, workload)
    n = cluster.n_gpus
    scored, rejected = {}, {}
    for tp in values["tp"]:
        for cp in values["cp"]:
            for pp in values["pp"]:
                if n % (tp * cp * pp) or n // (tp * cp * pp) not in values["dp"]:
                    continue
                dp = n // (tp * cp * pp)
                for ep in expert_degrees(model, tp * dp * cp):
                    for strategy in workload.dp_strategies:
                        if dp * cp == 1 and strategy != "ddp" and (ep == 1 or ep == tp * dp * cp):
                            continue  # nothing to shard over
                        layout = Layout(tp, pp, dp, ep=ep, cp=cp, dp_strategy=strategy)
                        result = best_configuration(model, cluster, layout, workload)
                        (rejected if isinstance(result, Rejected) else scored)[layout] = result
    ranked = rank(list(scored.values()))
    ranked = [replace(s, reasons=own_reasons(s, cluster, workload)) for s in ranked]
    return TrainingPlan(model.name, cluster.name, workload, tuple(ranked), tuple(rejected.values()), tuple(pruned),
                        plan_reasons(ranked, rejected, pruned, scored))
