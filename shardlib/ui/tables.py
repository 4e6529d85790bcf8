"""Plain-text tables a notebook prints: the serving and training plans, the tensor-parallel cost table,
replicas against tp, the KV hand-off per model and link, the training planner beside published layouts and
figures, a GPU fit in words, a pipeline schedule as a grid of labels. Numbers in (from ``shardlib.predict``),
text out.
"""

from __future__ import annotations

from shardlib.core.config import ModelConfig
from shardlib.core.pipeline.schedules import Schedule, simulate
from shardlib.predict.serving.cost import tp_cost_table
from shardlib.predict.serving.memory import GpuFit
from shardlib.predict.serving.planner import Plan
from shardlib.predict.serving.presets import HANDOFF_LINKS, NODE_LINKS, REAL_MODELS, handoff_need
from shardlib.predict.training.choices import ChoiceRow
from shardlib.predict.training.planner import TrainingPlan
from shardlib.predict.training.time_model import TrainingScore
from shardlib.predict.units import gb, ms, seconds
from shardlib.ui.serving_reasons import plan_reasons, score_notes, score_reasons


def format_plan(p: Plan, top: int = 8, reasons_for: int = 1) -> str:
    """The ranked layouts (units in the headings), why the best won, the reasons of the first
    ``reasons_for`` layouts, and every rejection, as plain text."""
    efficiency = p.workload.kernel_efficiency
    lines = [f"{p.model.name} on {p.cluster.name}, ranked by {p.objective}:",
             f"{'layout':<20}{'batch':>6}{'memory/GPU':>12}{'ms/token':>10}{'tokens/s':>11}{'per GPU':>9}"
             f"{'1st token ms':>13}{'idle':>6}  tp link"]
    for s in p.ranked[:top]:
        lines.append(f"{s.layout.label:<20}{s.batch:>6}{gb(s.memory.total_bytes):>12}{s.decode_step_s * 1e3:>10.2f}"
                     f"{s.tokens_per_s:>11,.0f}{s.tokens_per_s_per_gpu:>9,.0f}{s.first_token_s * 1e3:>13.1f}"
                     f"{s.idle_fraction:>6.2f}  {s.tp_link if s.layout.tp > 1 else '-'}")
        lines += [f"{'':<4}note: {n}" for n in score_notes(p.model, p.cluster, s.layout, p.workload)]
    if len(p.ranked) > top:
        lines.append(f"... and {len(p.ranked) - top} more feasible layouts")
    if p.ranked:
        lines.append("(batch: sequences in flight per replica; ms/token: time between two tokens of a sequence; "
                     "per GPU: tokens/s per GPU; idle: share of a cycle the slowest stage waits)")
        lines.append("(a model, not a measurement: " + ("times are floors, at 100% of peak memory bandwidth and FLOPs "
                     "with no kernel overhead; set Workload(kernel_efficiency=...) for real kernels)"
                     if efficiency == 1 else f"kernels at {efficiency:.0%} of peak memory bandwidth "
                     "and FLOPs)"))
    if not p.ranked:
        lines.append("(no layout fits)")
    lines += [f"why: {r}" for r in plan_reasons(p)]
    for s in p.ranked[:reasons_for]:
        lines += [f"  {s.layout.label}: {r}" for r in score_reasons(p, s)]
    lines.append(f"rejected ({len(p.rejected)}):")
    lines += [f"  {r.layout.label}: " + "; ".join(r.reasons) for r in p.rejected]
    return "\n".join(lines)


def format_tp_cost_table(model: ModelConfig, links, tp_degrees=(2, 4, 8), prompt_tokens: int = 2048,
                         latency_charge: str = "per_call") -> str:
    """The table as plain text: decode in microseconds per token, prefill in milliseconds per prompt."""
    rows = tp_cost_table(model, links, tp_degrees, prompt_tokens, latency_charge)
    decode0, prefill0 = rows[0]["decode"][tp_degrees[0]], rows[0]["prefill"][tp_degrees[0]]
    name_w = max(26, max(len(row["link"]) for row in rows) + 2)
    heads = "".join(f"{'tp=' + str(n):>9}" for n in tp_degrees)
    lines = [f"{model.name}: {model.n_layers} layers, d_model {model.d_model}, {model.bytes_per_param:g} bytes per "
             f"value; {decode0.collectives} all-reduces per forward pass ({latency_charge} latency; "
             f"alpha-beta model, not a measurement)",
             f"decode: 1 token, {decode0.size_bytes:,} bytes per all-reduce;  prefill: {prompt_tokens:,}-token "
             f"prompt, {prefill0.size_bytes:,} bytes per all-reduce",
             f"{'':<{name_w}}{'decode, us per token':>{9 * len(tp_degrees)}}   "
             f"{'prefill, ms per prompt':>{9 * len(tp_degrees)}}",
             f"{'link':<{name_w}}{heads}   {heads}"]
    for row in rows:
        decode = "".join(f"{row['decode'][n].total_s * 1e6:>9.0f}" for n in tp_degrees)
        prefill = "".join(f"{row['prefill'][n].total_s * 1e3:>9.1f}" for n in tp_degrees)
        lines.append(f"{row['link']:<{name_w}}{decode}   {prefill}")
    return "\n".join(lines)


def format_latency_vs_throughput(points, model_name: str = "") -> str:
    """The points as a table: batch, latency (alone and loaded), tokens per second in all and per GPU."""
    lines = [f"{model_name}".strip(),
             f"{'':<12}{'GPUs':>5}{'batch':>7}{'ms/token alone':>16}{'ms/token loaded':>17}{'tokens/s':>11}"
             f"{'per GPU':>9}"]
    for p in points:
        if not p.feasible:
            lines.append(f"{p.label:<12}{p.n_gpus:>5}  not an option: {p.problem}")
            continue
        lines.append(f"{p.label:<12}{p.n_gpus:>5}{p.batch:>7}{ms(p.latency_alone_s):>16}{ms(p.latency_s):>17}"
                     f"{p.tokens_per_s:>11,.0f}{p.tokens_per_s_per_gpu:>9,.0f}")
    return "\n".join(line for line in lines if line)


def handoff_table(prompt_tokens: int, rate_per_s: float, models=REAL_MODELS, links=HANDOFF_LINKS,
                  tp: int = 8, gpus_per_node: int = 8) -> str:
    """One row per model: KV bytes a request (every rank), GB/s each rank's link carries, and the share of
    each link (one way) that takes. ``tp`` ranks a pool's replica (8: one node). A link inside a node
    (``NODE_LINKS``) shows "-" when the two pools, ``2 x tp`` GPUs, do not fit one node of ``gpus_per_node``:
    the hand-off then crosses the network."""
    apart = 2 * tp > gpus_per_node  # the prefill pool and the decode pool on different nodes
    head = f"{'model':<16}{'MB/request':>11}{'GB/s/rank':>10}" + "".join(f"{lk.name[:18]:>20}" for lk in links)
    rows = [f"{prompt_tokens} prompt tokens, {rate_per_s:g} requests/s, tp = {tp}: share of each link (one way)",
            head]
    for model in models:
        need = handoff_need(model, prompt_tokens, rate_per_s, tp)
        cells = "".join(f"{'-':>20}" if apart and lk in NODE_LINKS else f"{need.link_share(lk):>20.1%}"
                        for lk in links)
        rows.append(f"{model.name:<16}{need.kv_bytes_per_request / 1e6:>11.1f}{need.bytes_per_s_per_rank / 1e9:>10.2f}"
                    + cells)
    if apart and any(lk in NODE_LINKS for lk in links):
        rows.append(f"-: two pools of {tp} GPUs need {2 * tp}, more than a node's {gpus_per_node}, so the hand-off "
                    "crosses the network")
    return "\n".join(rows)


def format_training_plan(p: TrainingPlan, top: int = 6, rejected: int = 4) -> str:
    """The ranked layouts, term by term, why the best won, and a few rejections with their numbers."""
    moe = any(s.layout.ep > 1 for s in p.ranked)
    lines = [f"{p.model} on {p.cluster}, training {p.workload.global_batch_tokens:,} tokens a step in sequences of "
             f"{p.workload.sequence_tokens:,}, ranked by tokens/s:",
             f"{'layout':<30}{'b x m':>8}{'recompute':>10}{'GB/GPU':>8}{'step':>10}{'bubble':>9}{'tp':>9}"
             f"{'cp':>9}{'dp':>9}" + (f"{'ep':>9}" if moe else "") + f"{'tokens/s':>12}{'MFU':>6}"]
    for s in p.ranked[:top]:
        lines.append(f"{s.layout.label:<30}{f'{s.microbatch}x{s.n_microbatches}':>8}{s.recompute:>10}"
                     f"{s.memory.total_bytes / 1e9:>8.1f}{seconds(s.step_s):>10}{ms(s.bubble_s):>9}{ms(s.tp_s):>9}"
                     f"{ms(s.cp_s):>9}{ms(s.dp_s):>9}" + (f"{ms(s.ep_s):>9}" if moe else "")
                     + f"{s.tokens_per_s:>12,.0f}{s.mfu:>6.0%}")
    if len(p.ranked) > top:
        lines.append(f"... and {len(p.ranked) - top} more that fit")
    lines += [f"why: {r}" for r in p.reasons]
    if p.best:
        lines += [f"  {r}" for r in p.best.reasons]
    lines.append(f"rejected: {len(p.rejected)} layouts (first {min(rejected, len(p.rejected))}); pruned axis values: "
                 f"{len(p.pruned)}")
    lines += [f"  {r.layout.label}: {r.reasons[0]}" for r in p.rejected[:rejected]]
    return "\n".join(lines)


def format_training_choices(rows: list[ChoiceRow]) -> str:
    """The rows as a table (the planner's choice; the published layout, its reported throughput and its score
    under the same model), then each row's notes."""
    lines = [f"{'model':<16}{'GPUs':>7}{'seq':>8}  {'planner':<42}{'M tok/s':>8}{'MFU':>5}  {'published':<38}"
             f"{'reported':>13}{'scored':>7}"]
    for r in rows:
        c, pub, ours = r.chosen, r.published, r.published_score
        mine = f"{c.layout.label} ({c.recompute})" if c else "nothing fits"
        reported = ("-" if pub is None else f"{pub.mfu:.0%} MFU" if pub.mfu else
                    f"{pub.tokens_per_s / 1e6:.1f} M tok/s")
        scored = f"{ours.mfu:.0%}" if isinstance(ours, TrainingScore) else "-" if pub is None else "no fit"
        lines.append(f"{r.model:<16}{r.gpus:>7,}{r.sequence_tokens:>8,}  {mine:<42}"
                     f"{(c.tokens_per_s / 1e6 if c else 0):>8.2f}{(c.mfu if c else 0):>5.0%}  "
                     f"{pub.label if pub else '-':<38}{reported:>13}{scored:>7}")
    for r in rows:
        lines.append(f"{r.model} on {r.gpus:,} GPUs, {r.sequence_tokens:,} tokens"
                     + (", all-to-alls under compute (DualPipe):" if r.overlap else ":"))
        lines += [f"  - {n}" for n in r.notes]
    return "\n".join(lines)


def format_rows(rows) -> str:
    """The rows as a plain-text table, then each row's note."""
    lines = [f"{'source':<54}{'what':<62}{'published':>11}{'ours':>11}  unit"]
    for r in rows:
        lines.append(f"{r.source:<54}{r.what:<62}{r.published:>11,.2f}{r.ours:>11,.2f}  {r.unit}")
    notes = {}
    for r in rows:
        notes.setdefault(r.note, r.what)
    lines += [f"  {what}: {note}" for note, what in notes.items() if note]
    return "\n".join(lines)


def schedule_text(schedule: Schedule) -> str:
    """The schedule as a grid of labels, one line per stage, one column per slot ('.' for idle),
    every action one slot long."""
    timed = simulate(schedule, forward_s=schedule.n_chunks, backward_s=schedule.n_chunks)
    n_slots = int(max(t.end_s for t in timed))
    width = max(len(t.action.label) for t in timed)
    grid = [["."] * n_slots for _ in range(schedule.n_stages)]
    for t in timed:
        grid[t.action.stage][int(t.start_s)] = t.action.label
    return "\n".join(f"stage {s}: " + " ".join(cell.ljust(width) for cell in row).rstrip()
                     for s, row in enumerate(grid))


def order_text(schedule: Schedule) -> dict[int, str]:
    """Per stage, its actions in order as one line of labels (no timing)."""
    return {s: " ".join(a.label for a in row) for s, row in enumerate(schedule.actions)}


def format_fit(fit: GpuFit) -> str:
    """One fit in words: the weights per GPU, the room they leave, the sequences that room holds."""
    where = f"one {fit.gpu}" if fit.tp == 1 else f"{fit.tp} x {fit.gpu} (tp = {fit.tp})"
    usable = f"{gb(fit.usable_bytes)} a server fills of {gb(fit.gpu_bytes)}"
    if fit.room_bytes <= 0:
        return (f"{fit.model} on {where}: {gb(fit.weights_bytes)} of weights per GPU, more than the {usable}: "
                "does not fit")
    return (f"{fit.model} on {where}: {gb(fit.weights_bytes)} of weights per GPU leave {gb(fit.room_bytes)} of the "
            f"{usable}: room for {fit.sequences:,} sequence{'s' if fit.sequences != 1 else ''} of "
            f"{fit.context_tokens:,} tokens ({gb(fit.kv_bytes_per_sequence)} of KV cache each)")
