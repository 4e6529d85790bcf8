"""The layout planner: every (tp, pp, dp, ep) of a model on a cluster, the feasible ones scored and ranked.

``plan(model, cluster, workload, objective)`` enumerates every ``Layout`` with ``tp x pp x dp`` = the
cluster's GPUs (and, for MoE models, every ``ep``), rejects those that break a rule of ``memory`` (with
the reason), and scores the rest with ``costs`` and the bubble formula.

**Scores.** A decode step gives every sequence one token. With ``pp > 1`` the batch goes through in
``m`` microbatches, so the step is ``(m + pp - 1)`` stage-times plus the last microbatch's hops, and
the idle share is the bubble fraction ``(pp - 1)/(m + pp - 1)``. One stage-time is a compute proxy plus
that stage's collectives:

* decode compute: memory-bound, every weight of the GPU and its microbatch's KV cache read once,
  ``(weights + kv/m) / memory_bytes_per_s``;
* prefill compute: ``2 x active parameters of the GPU x tokens / peak_flops_per_s`` (embedding and
  attention scores left out);
* tensor parallelism: ``2 x L/pp`` all-reduces of ``tokens x d_model x b`` (1 per layer when ep > 1);
* expert parallelism: ``2 x L/pp`` all-to-alls of ``tokens x k x d_model x b``;
* pipeline: one point-to-point of ``tokens x d_model x b`` per stage boundary.

Each axis's collectives run over the cluster's link inside a node, or between nodes when any of its
groups crosses one. Decode latency per token is the step; throughput is ``dp x batch / step``. The
planner ranks by throughput (``objective="throughput"``) or by decode latency (``objective="latency"``).

``forward_traffic`` is the collectives one forward pass issues per mesh axis: the prediction that the
combined run on ranks (``drivers.run_combined``) must match call for call and byte for byte.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import choice, whole_number
from ..costs.alpha_beta import all_reduce_s, all_to_all_s, point_to_point_s
from ..hardware import Cluster, Link
from ..models import ModelConfig
from ..pipeline.bubble import pipeline_bubble_fraction
from .layout import Layout
from .memory import Memory, Workload, active_params_per_gpu, check_layout, gb, layout_problems, memory_per_gpu

OBJECTIVES = ("throughput", "latency")


# -- placement: which link each axis uses ---------------------------------------------------------------
def _crosses(cluster: Cluster, ranks) -> bool:
    return len({cluster.node_of(r) for r in ranks}) > 1


def hop_links(layout: Layout, cluster: Cluster) -> list[Link]:
    """The link of each stage boundary: the slower one if any rank's hop across it leaves its node."""
    out = []
    for s in range(layout.pp - 1):
        pairs = [(layout.rank(s, d, t), layout.rank(s + 1, d, t)) for d in range(layout.dp) for t in range(layout.tp)]
        out.append(cluster.inter_link if any(_crosses(cluster, p) for p in pairs) else cluster.intra_link)
    return out


def axis_link(cluster: Cluster, groups) -> Link:
    return cluster.inter_link if any(_crosses(cluster, g) for g in groups) else cluster.intra_link


# -- traffic: what one forward pass sends, per mesh axis (the combined run on ranks checks this) --------
@dataclass(frozen=True)
class AxisTraffic:
    """Summed over every rank: ``count`` calls of ``op`` on mesh axis ``axis``, ``size_bytes`` in all
    (``comm.py``'s counting: the buffer each rank works on)."""

    axis: str
    op: str
    count: int
    size_bytes: int


def forward_traffic(model: ModelConfig, layout: Layout, batch: int, seq_tokens: int, n_microbatches: int) -> list[AxisTraffic]:
    """The collectives of one forward pass of ``batch`` sequences of ``seq_tokens`` per replica, cut
    into ``n_microbatches`` equal microbatches: per rank, ``2 x L/pp`` all-reduces per microbatch on
    the tp axis (1 per layer when ep > 1, plus 2 all-to-alls on the ep axis), and each tp rank of a
    stage sends its copy of the microbatch's activations to its counterpart in the next stage."""
    whole_number(batch, "batch")
    whole_number(seq_tokens, "seq_tokens")
    m = whole_number(n_microbatches, "n_microbatches")
    if batch % m or model.n_layers % layout.pp:
        raise ValueError(f"forward_traffic needs equal pieces: batch {batch} into {m} microbatches "
                         f"({batch} % {m} = {batch % m}), {model.n_layers} layers into {layout.pp} stages "
                         f"({model.n_layers} % {layout.pp} = {model.n_layers % layout.pp})")
    mb_bytes = int(batch // m * seq_tokens * model.d_model * model.bytes_per_param)
    layers = model.n_layers // layout.pp
    out = []
    if layout.tp > 1:
        per_rank = (1 if layout.ep > 1 else 2) * layers * m
        out.append(AxisTraffic("tp", "all_reduce", layout.world_size * per_rank, layout.world_size * per_rank * mb_bytes))
    if layout.ep > 1:
        per_rank = 2 * layers * m
        a2a = mb_bytes * model.experts_per_token
        out.append(AxisTraffic("ep", "all_to_all_single", layout.world_size * per_rank, layout.world_size * per_rank * a2a))
    if layout.pp > 1:
        n = (layout.pp - 1) * layout.tp * layout.dp * m
        out += [AxisTraffic("pp", "send", n, n * mb_bytes), AxisTraffic("pp", "recv", n, n * mb_bytes)]
    return out


# -- scores ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Score:
    layout: Layout
    memory: Memory
    n_microbatches: int
    decode_stage_s: float  # one microbatch through one stage: compute proxy + collectives
    decode_step_s: float  # = decode latency per token
    prefill_s: float  # one batch of prompts
    tokens_per_s: float  # decode, whole cluster
    bubble_fraction: float
    tp_link: str
    notes: tuple[str, ...] = ()

    @property
    def decode_latency_s(self) -> float:
        return self.decode_step_s


def _stage_comm_s(model, cluster, layout, tokens, tp_link, ep_link) -> float:
    size = tokens * model.d_model * model.bytes_per_param
    layers = model.n_layers // layout.pp
    t = 0.0
    if layout.tp > 1:
        t += (1 if layout.ep > 1 else 2) * layers * all_reduce_s(size, layout.tp, tp_link, cluster.latency_charge)
    if layout.ep > 1:
        t += 2 * layers * all_to_all_s(size * model.experts_per_token, layout.ep, ep_link, cluster.latency_charge)
    return t


def _hops_s(model, tokens, links) -> float:
    return sum(point_to_point_s(tokens * model.d_model * model.bytes_per_param, link) for link in links)


def score(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> Score:
    """Decode latency, prefill time, throughput and bubble of a layout that passes every rule."""
    check_layout(model, cluster, layout, workload)
    mem = memory_per_gpu(model, layout, workload)
    m = workload.microbatches_for(layout.pp)
    tp_link = axis_link(cluster, layout.tp_groups())
    ep_link = axis_link(cluster, layout.ep_groups())
    hops = hop_links(layout, cluster)
    notes = []
    if layout.tp > cluster.gpus_per_node:
        notes.append(f"tp = {layout.tp} spans {layout.tp // cluster.gpus_per_node} nodes of {cluster.gpus_per_node}: "
                     f"its all-reduces run over {cluster.inter_link.name}")
    decode_tokens = workload.batch / m  # one new token per sequence of the microbatch
    stage = ((mem.weights_bytes + mem.kv_cache_bytes / m) / cluster.memory_bytes_per_s
             + _stage_comm_s(model, cluster, layout, decode_tokens, tp_link, ep_link))
    step = (m + layout.pp - 1) * stage + _hops_s(model, decode_tokens, hops)
    prefill_tokens = workload.batch * workload.prompt_tokens / m
    prefill_stage = (2 * active_params_per_gpu(model, layout) * prefill_tokens / cluster.peak_flops_per_s
                     + _stage_comm_s(model, cluster, layout, prefill_tokens, tp_link, ep_link))
    prefill = (m + layout.pp - 1) * prefill_stage + _hops_s(model, prefill_tokens, hops)
    return Score(layout, mem, m, stage, step, prefill, layout.dp * workload.batch / step,
                 pipeline_bubble_fraction(layout.pp, m), tp_link.name, tuple(notes))


# -- the planner --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rejected:
    layout: Layout
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Plan:
    model: str
    cluster: str
    objective: str
    ranked: tuple[Score, ...]  # best first
    rejected: tuple[Rejected, ...]

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


def plan(model: ModelConfig, cluster: Cluster, workload: Workload = Workload(), objective: str = "throughput") -> Plan:
    """Every layout of ``model`` on ``cluster``: the feasible ones ranked by ``objective`` (highest
    decode throughput, or lowest decode latency per token; ties go to the other, then to fewer model
    splits), and the rest with their reasons."""
    choice(objective, OBJECTIVES, "objective")
    ranked, rejected = [], []
    for layout in enumerate_layouts(model, cluster.n_gpus):
        problems = layout_problems(model, cluster, layout, workload)
        if problems:
            rejected.append(Rejected(layout, tuple(problems)))
        else:
            ranked.append(score(model, cluster, layout, workload))

    def key(s: Score):
        splits = s.layout.tp * s.layout.pp
        if objective == "throughput":
            return (-round(s.tokens_per_s, 6), s.decode_step_s, splits)
        return (round(s.decode_step_s, 12), -s.tokens_per_s, splits)

    return Plan(model.name, cluster.name, objective, tuple(sorted(ranked, key=key)), tuple(rejected))


def format_plan(p: Plan, top: int = 8) -> str:
    """The ranked layouts and every rejection, as plain text."""
    lines = [f"{p.model} on {p.cluster}, ranked by {p.objective}:",
             f"{'layout':<22}{'memory/GPU':>11}{'decode ms/token':>17}{'tokens/s':>11}{'prefill ms':>12}{'bubble':>8}  tp link"]
    for s in p.ranked[:top]:
        lines.append(f"{s.layout.label:<22}{gb(s.memory.total_bytes):>11}{s.decode_step_s * 1e3:>17.2f}"
                     f"{s.tokens_per_s:>11,.0f}{s.prefill_s * 1e3:>12.1f}{s.bubble_fraction:>8.2f}  "
                     f"{s.tp_link if s.layout.tp > 1 else '-'}")
        lines += [f"{'':<4}note: {n}" for n in s.notes]
    if len(p.ranked) > top:
        lines.append(f"... and {len(p.ranked) - top} more feasible layouts")
    if not p.ranked:
        lines.append("(no layout fits)")
    lines.append(f"rejected ({len(p.rejected)}):")
    lines += [f"  {r.layout.label}: " + "; ".join(r.reasons) for r in p.rejected]
    return "\n".join(lines)
