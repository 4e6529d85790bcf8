"""The serving planner's reasons, in words a learner reads: what set a layout's batch, where a token's time
goes, how a layout that crosses nodes with its pipeline compares with the one that crosses them with tensor
parallelism (the same GPUs per copy, cut the other way, ``traffic.counterpart``), why the best won, and what
a layout pays for passing a wall (``score_notes``).

A pipeline across nodes sends one small message per stage boundary over the slow link but runs its
stages one after another; tensor parallelism across nodes splits every weight read over all the GPUs
but pays two all-reduces per layer over the slow link. Which wins is a matter of numbers (notebook 05
shows both). Numbers in (a ``Plan``), sentences out.
"""

from __future__ import annotations

from dataclasses import replace

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import Cluster
from shardlib.predict.serving.decode import Score, ep_all_to_all, score
from shardlib.predict.serving.memory import Workload, kv_bytes_per_sequence, layout_problems
from shardlib.predict.serving.planner import Plan, objective_workload
from shardlib.predict.serving.traffic import counterpart, kind, tp_crosses_nodes
from shardlib.predict.shapes import kv_head_copies, stage_layers
from shardlib.predict.units import gb, ms


def _count(x: float) -> str:
    return f"{x:,.0f}" if x == int(x) else f"{x:,.1f}"


def score_reasons(p: Plan, s: Score) -> tuple[str, ...]:
    """Why ``s``, one of ``p``'s ranked layouts, scores what it does, and how its counterpart across nodes
    compares."""
    work = objective_workload(p.workload, p.objective)
    extra = counterpart_reason(p.model, p.cluster, work, s, {r.layout: r for r in p.ranked})
    return own_reasons(p.model, p.cluster, work, s) + ((extra,) if extra else ())


def score_notes(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> tuple[str, ...]:
    """What ``layout`` pays for passing a wall, in words: tp across nodes, KV heads copied, uneven stages."""
    notes = []
    if tp_crosses_nodes(layout, cluster):
        notes.append(f"tp = {layout.tp} spans {layout.tp // cluster.gpus_per_node} nodes of {cluster.gpus_per_node}: "
                     f"its all-reduces run over {cluster.inter_link.name}")
    copies = kv_head_copies(model, layout.tp)
    if copies > 1:
        kv = kv_bytes_per_sequence(model, layout, workload.context_tokens)
        kv_weights = 2 * model.d_model * model.head_dim * stage_layers(model, layout.pp) * model.matrix_bytes_per_param
        notes.append(f"each of the {model.n_kv_heads} KV heads copied on {copies} GPUs: a sequence's KV cache stays "
                     f"{gb(kv)} per GPU, as at tp = {model.n_kv_heads} (it would be {gb(kv / copies)} if it still "
                     f"shrank), and {gb(kv_weights * (1 - 1 / copies))} of k and v weights per GPU are copies")
    sizes = sorted(set(stage_layer_counts(model.n_layers, layout.pp)), reverse=True)
    if len(sizes) > 1:
        notes.append(f"uneven stages of {' and '.join(map(str, sizes))} layers: the {sizes[0]}-layer stages set the "
                     f"pace, the others wait {1 - sizes[1] / sizes[0]:.0%} of each step")
    return tuple(notes)


def own_reasons(model: ModelConfig, cluster: Cluster, workload: Workload, s: Score) -> tuple[str, ...]:
    """What set ``s``'s batch, and where a token's time goes."""
    lay = s.layout
    if s.batch_set_by == "the workload":
        batch = f"batch {s.batch} per replica, as the workload fixes it"
    else:
        usable = workload.usable_bytes(cluster)
        per_seq = kv_bytes_per_sequence(model, lay, workload.context_tokens)
        held = int((usable - s.memory.weights_bytes) // per_seq)
        batch = (f"batch {s.batch} per replica, set by {s.batch_set_by}: {gb(s.memory.weights_bytes)} of weights leave "
                 f"{gb(usable - s.memory.weights_bytes)} of the {gb(usable)} usable per GPU, {gb(per_seq)} of KV cache "
                 f"per sequence at {workload.context_tokens:,} tokens" + (f" (room for {held:,})"
                                                                          if s.batch_set_by == "max_batch" else ""))
    first = s.stages[0]
    comm = (f" + {first.collectives * lay.pp} collectives over {s.tp_link if lay.tp > 1 else 'the expert link'} "
            f"({ms(s.comm_s)})" if s.comm_s else "")
    if lay.pp == 1:
        work = max(first.read_s, first.compute_s)
        bound = "reading memory" if first.read_s >= first.compute_s else "arithmetic"
        trip = f"one step: {ms(work)} of {bound}{comm} = {ms(s.decode_step_s)} per token"
    else:
        m = s.n_microbatches
        stages = " + ".join(ms(st.total_s) for st in s.stages)
        in_flight = (f"{m} microbatch{'es' if m > 1 else ''} of {_count(s.batch / m)} "
                     f"sequence{'s' if s.batch != m else ''} in flight")
        trip = (f"a token's trip: {lay.pp} stages one after another ({stages}) + {ms(s.hops_s)} of hops = "
                f"{ms(s.trip_s)}; {in_flight}, the slowest stage busy {m} x {ms(s.decode_stage_s)}: a token every "
                f"{ms(s.decode_step_s)} per sequence")
    return (batch, trip) + ((expert_reason(model, cluster, s),) if lay.ep > 1 else ())


def expert_reason(model: ModelConfig, cluster: Cluster, s: Score) -> str:
    """Where an ep layout's experts sit and what its all-to-alls cost, in words: across nodes, the rows a token
    sends over each link, and without the node limit where the router has one (``decode.ep_all_to_all``)."""
    lay = s.layout
    tokens = s.batch / s.n_microbatches  # a decode microbatch of one replica
    one = ep_all_to_all(model, cluster, lay, tokens)
    where = (f"on {one.nodes} nodes" if one.nodes > 1 else "inside one node")
    legs = ""
    if one.nodes > 1:
        legs = (f"; a token sends {one.network_rows_per_token:.2f} rows over {cluster.inter_link.name} and "
                f"{one.node_rows_per_token:.2f} over {cluster.intra_link.name}")
    if one.nodes > 1 and model.node_limit:
        free = ep_all_to_all(replace(model, node_limit=0), cluster, lay, tokens)
        legs += (f" (its experts on at most {model.node_limit} nodes, one copy a node; with no limit "
                 f"{free.network_rows_per_token:.2f} and {free.node_rows_per_token:.2f})")
    return (f"experts: {model.n_experts // lay.ep} of {model.n_experts} per GPU, spread over ep = {lay.ep} ranks "
            f"{where}; each MoE layer's dispatch and combine take {ms(one.seconds)} each for a microbatch{legs}")


def _side(s: Score, cluster: Cluster) -> str:
    """Why one side of a comparison costs what it does: its stages in turn, its all-reduces across nodes."""
    lay, st = s.layout, s.stages[0]
    parts = []
    if lay.pp > 1:
        parts.append(f"runs its {lay.pp} stages one after another ({' + '.join(ms(x.total_s) for x in s.stages)}, "
                     f"+ {ms(s.hops_s)} of hops)" + (f" and each stage re-reads its weights for every one of "
                                                    f"{s.n_microbatches} microbatches" if s.n_microbatches > 1 else ""))
    if tp_crosses_nodes(lay, cluster):
        per = " per stage" if lay.pp > 1 else ""
        parts.append(f"splits {'each stage' if lay.pp > 1 else 'the model'} tp = {lay.tp} ways, reading 1/{lay.tp} "
                     f"of its weights per GPU at once ({ms(max(st.read_s, st.compute_s))}{per}) but paying "
                     f"{st.collectives} all-reduces over {s.tp_link} ({ms(st.comm_s)}{per})")
    return f"{lay.label} " + " and ".join(parts)


def compare(a: Score, b: Score, cluster: Cluster) -> str:
    """``a`` against its counterpart ``b``: both numbers, the winner each way and by how much, and why."""
    ka, kb = kind(a.layout, cluster), kind(b.layout, cluster)
    fast, slow = sorted((a, b), key=lambda s: s.decode_step_s)
    many, few = sorted((a, b), key=lambda s: -s.tokens_per_s)
    return (f"{ka} ({a.layout.label}): {ms(a.decode_step_s)}/token, {a.tokens_per_s:,.0f} tokens/s at batch {a.batch}; "
            f"{kb} ({b.layout.label}): {ms(b.decode_step_s)}/token, {b.tokens_per_s:,.0f} tokens/s at batch {b.batch}. "
            f"Latency: {kind(fast.layout, cluster)} wins, {slow.decode_step_s / fast.decode_step_s:.2f}x faster; "
            f"throughput: {kind(many.layout, cluster)} wins, {many.tokens_per_s / few.tokens_per_s:.2f}x the tokens. "
            f"Because {_side(a, cluster)}, while {_side(b, cluster)}.")


def counterpart_reason(model: ModelConfig, cluster: Cluster, workload: Workload, s: Score,
                       scored: dict[Layout, Score]) -> str:
    """``s`` against its counterpart across nodes ("" when it has none): compared when it is feasible;
    otherwise why not, and, when only the KV heads forbid it, what copying them would give."""
    other = counterpart(s.layout, cluster)
    if other is None:
        return ""
    if other in scored:
        return compare(s, scored[other], cluster)
    problems = layout_problems(model, cluster, other, workload)
    text = f"{kind(other, cluster)} ({other.label}) is ruled out: {problems[0] if problems else 'not enumerated'}"
    copied = replace(workload, copy_kv_heads=True)
    if not workload.copy_kv_heads and problems and not layout_problems(model, cluster, other, copied):
        alt = score(model, cluster, other, copied)
        text += (f". With each KV head copied on {other.tp // model.n_kv_heads} GPUs (vLLM's way past the KV-head "
                 f"count) it would be: " + compare(s, alt, cluster))
    return text


def _value(s: Score, objective: str) -> str:
    if objective == "first_token":
        return f"a first token in {ms(s.first_token_s)}"
    return f"{s.tokens_per_s:,.0f} tokens/s" if objective == "throughput" else f"{ms(s.decode_step_s)} per token"


def plan_reasons(p: Plan) -> tuple[str, ...]:
    """Why ``p``'s best layout won, against the runner-up."""
    objective, workload, ranked, cluster = p.objective, p.workload, p.ranked, p.cluster
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
        elif objective == "first_token":
            margin = f"{second.first_token_s / best.first_token_s:.2f}x sooner than"
        else:
            margin = f"{second.decode_step_s / best.decode_step_s:.2f}x faster than"
        out.append(f"best for {objective}: {best.layout.label} ({kind(best.layout, cluster)}), "
                   f"{_value(best, objective)}, "
                   f"{margin} the next, {second.layout.label} ({_value(second, objective)})")
    else:
        out.append(f"best for {objective}: {best.layout.label}, the only layout that fits")
    return tuple(out)
