"""Pure layout planner: which (tp, pp, ep, dp) layouts a model allows on a cluster, and what each costs.

A *layout* splits ``n_gpus = tp x pp x dp`` devices into ``dp`` replicas (independent copies of the
model), each a pipeline of ``pp`` stages (whole layers, GPipe-style; Huang et al. 2019), each stage
split ``tp`` ways inside its layers (Megatron-LM; Shoeybi et al. 2019). Ranks are numbered with ``tp``
innermost and ``pp`` outermost, as Megatron-LM orders its groups, so a tensor-parallel group is
``tp`` consecutive ranks (inside one node whenever ``tp`` divides the GPUs per node) and the stages
sit on successive blocks of ranks (across nodes once a stage fills a node)::

    rank = stage * (dp * tp) + replica * tp + tp_rank

**Expert parallelism** (GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021) is not a
fourth factor of ``n_gpus`` here: ``ep`` counts the ranks *of one pipeline stage* (its ``tp x dp``
ranks) over which the experts of each MoE layer are spread, ``n_experts / ep`` whole experts per rank,
so ``ep`` must divide ``tp x dp``. With ``ep = 1`` the experts are instead sliced ``tp`` ways like a
dense MLP (what Mixtral deployments with plain tensor parallelism do). With ``ep > 1`` the attention
still ends in one tensor-parallel all-reduce per layer, and the MoE block costs two all-to-alls
(dispatch and combine) over the ``ep`` ranks instead of the MLP's all-reduce.

**Memory per GPU** (the heaviest stage; activations and framework overhead are left out)::

    weights = L/pp x (attention + norms + router) / tp x b
            + L/pp x n_experts x expert / (ep if ep > 1 else tp) x b
            + copies x vocab x d_model / tp x b        (copies: 2 untied or 1 tied with pp = 1; 1 with pp > 1)
    kv      = 2 x L/pp x (n_kv_heads / tp) x head_dim x b x batch x context_tokens

with ``b`` bytes per value and ``batch`` the sequences in flight per replica.

**Scores** (``costs.py`` prices every message; ``pipeline.py`` gives the bubble). A decode step gives
every sequence one token. With ``pp > 1`` the batch goes through in ``m`` microbatches, so the step is
``(m + pp - 1)`` stage-times plus the last microbatch's hops, and the idle share is the bubble
fraction ``(pp - 1)/(m + pp - 1)``. One stage-time is a compute proxy plus that stage's collectives:

* decode compute: memory-bound, every weight of the GPU and its microbatch's KV cache read once,
  ``(weights + kv/m) / memory_bytes_per_s``;
* prefill compute: ``2 x active parameters of the GPU x tokens / peak_flops_per_s`` (embedding and
  attention scores left out);
* tensor parallelism: ``2 x L/pp`` all-reduces of ``tokens x d_model x b`` (1 per layer when ep > 1);
* expert parallelism: ``2 x L/pp`` all-to-alls of ``tokens x k x d_model x b``;
* pipeline: one point-to-point of ``tokens x d_model x b`` per stage boundary.

Decode latency per token is the step; throughput is ``dp x batch / step``. The planner ranks by
throughput (``objective="throughput"``) or by decode latency (``objective="latency"``).

Pure: no torch, no torch.distributed. The sections form one chain, each used by the next: inputs,
placement, memory, shape rules, traffic, scores, the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

from .checks import positive_number, whole_number
from .costs import (INFINIBAND_400G, NVLINK, Link, all_reduce_s, all_to_all_s,
                    point_to_point_s, HBM_BYTES_PER_S, LATENCY_CHARGES)
from .models import GPU_MEMORY_BYTES, ModelConfig, tensor_parallel_problems
from .pipeline import pipeline_bubble_fraction

OBJECTIVES = ("throughput", "latency")
H100_BF16_DENSE_FLOPS = 989e12  # NVIDIA H100 SXM datasheet: 989 TFLOPS BF16 dense (1,979 with sparsity)


def _gb(size_bytes: float) -> str:
    return f"{size_bytes / 1e9:.1f} GB" if size_bytes >= 1e8 else f"{size_bytes / 1e3:,.0f} kB"


# -- inputs -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cluster:
    """``nodes`` machines of ``gpus_per_node`` GPUs each; GPUs in a node talk over ``intra_link``,
    nodes over ``inter_link``."""

    name: str
    nodes: int
    gpus_per_node: int
    memory_per_gpu_bytes: float
    intra_link: Link
    inter_link: Link
    memory_bytes_per_s: float = HBM_BYTES_PER_S["H100 SXM"]
    peak_flops_per_s: float = H100_BF16_DENSE_FLOPS
    latency_charge: str = "per_call"  # how collectives pay latency: see costs.py

    def __post_init__(self) -> None:
        whole_number(self.nodes, f"{self.name}: nodes")
        whole_number(self.gpus_per_node, f"{self.name}: gpus_per_node")
        positive_number(self.memory_per_gpu_bytes, f"{self.name}: memory_per_gpu_bytes")
        positive_number(self.memory_bytes_per_s, f"{self.name}: memory_bytes_per_s")
        positive_number(self.peak_flops_per_s, f"{self.name}: peak_flops_per_s")
        for what in ("intra_link", "inter_link"):
            if not isinstance(getattr(self, what), Link):
                raise ValueError(f"{self.name}: {what} must be a costs.Link, got {getattr(self, what)!r}")
        if self.latency_charge not in LATENCY_CHARGES:
            raise ValueError(f"{self.name}: latency_charge must be one of {LATENCY_CHARGES}, got {self.latency_charge!r}")

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


@dataclass(frozen=True)
class Workload:
    """What is served: ``batch`` sequences in flight per replica, each with a KV cache of
    ``context_tokens``; prefill runs ``prompt_tokens`` per sequence; a pipeline cuts the batch into
    ``microbatches``."""

    batch: int = 8
    context_tokens: int = 4096
    prompt_tokens: int = 2048
    microbatches: int = 4

    def __post_init__(self) -> None:
        for name in ("batch", "context_tokens", "prompt_tokens", "microbatches"):
            whole_number(getattr(self, name), name)
        if self.prompt_tokens > self.context_tokens:
            raise ValueError(f"a prompt of {self.prompt_tokens} tokens does not fit a context of "
                             f"{self.context_tokens} tokens")

    def microbatches_for(self, pp: int) -> int:
        """``m``: 1 without a pipeline (nothing to overlap), else ``microbatches`` capped by the batch."""
        return 1 if pp == 1 else min(self.microbatches, self.batch)


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            whole_number(getattr(self, name), name)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" ep={self.ep}" if self.ep > 1 else "")

    def rank(self, stage: int, replica: int, tp_rank: int) -> int:
        return (stage * self.dp + replica) * self.tp + tp_rank


def check_mesh(layout: Layout, n_gpus: int) -> None:
    """A layout must use every GPU exactly once: ValueError with the arithmetic otherwise."""
    if layout.world_size != n_gpus:
        raise ValueError(f"tp x pp x dp = {layout.tp} x {layout.pp} x {layout.dp} = {layout.world_size}, but there "
                         f"are {n_gpus} GPUs: the mesh must multiply to the number of GPUs")


# -- placement: which link each axis uses ---------------------------------------------------------------
def _crosses(cluster: Cluster, ranks) -> bool:
    return len({cluster.node_of(r) for r in ranks}) > 1


def tp_groups(layout: Layout) -> list[list[int]]:
    return [[layout.rank(s, d, t) for t in range(layout.tp)] for s in range(layout.pp) for d in range(layout.dp)]


def ep_groups(layout: Layout) -> list[list[int]]:
    per_stage = layout.tp * layout.dp
    return [[s * per_stage + j * layout.ep + i for i in range(layout.ep)]
            for s in range(layout.pp) for j in range(per_stage // layout.ep)]


def hop_links(layout: Layout, cluster: Cluster) -> list[Link]:
    """The link of each stage boundary: the slower one if any rank's hop across it leaves its node."""
    out = []
    for s in range(layout.pp - 1):
        pairs = [(layout.rank(s, d, t), layout.rank(s + 1, d, t)) for d in range(layout.dp) for t in range(layout.tp)]
        out.append(cluster.inter_link if any(_crosses(cluster, p) for p in pairs) else cluster.intra_link)
    return out


def axis_link(cluster: Cluster, groups) -> Link:
    return cluster.inter_link if any(_crosses(cluster, g) for g in groups) else cluster.intra_link


# -- memory -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Memory:
    weights_bytes: float
    kv_cache_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes


def memory_per_gpu(model: ModelConfig, layout: Layout, workload: Workload) -> Memory:
    """Bytes on the GPU of the heaviest stage: the formula in the module docstring."""
    b, layers = model.bytes_per_param, model.n_layers / layout.pp
    router = model.d_model * model.n_experts if model.is_moe else 0
    dense = (model.attention_params_per_layer + 2 * model.d_model + router) / layout.tp
    experts = model.n_experts * model.expert_params / (layout.ep if layout.ep > 1 else layout.tp)
    copies = (1 if model.tied_embeddings else 2) if layout.pp == 1 else 1
    embed = copies * model.vocab_size * model.d_model / layout.tp
    weights = (layers * (dense + experts) + embed) * b
    kv = 2 * layers * (model.n_kv_heads / layout.tp) * model.head_dim * b * workload.batch * workload.context_tokens
    return Memory(weights, kv)


# -- shape rules ----------------------------------------------------------------------------------------
def layout_problems(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> list[str]:
    """Every reason ``layout`` cannot serve ``model`` on ``cluster`` (empty: it can), each with its numbers."""
    check_mesh(layout, cluster.n_gpus)
    tp, pp, ep, dp = layout.tp, layout.pp, layout.ep, layout.dp
    problems = [f"tp = {tp}: {p}" for p in tensor_parallel_problems(model, tp)]
    if tp > model.n_kv_heads:
        problems[0:0] = [f"tp = {tp} exceeds the {model.n_kv_heads} KV heads"]
    if tp < cluster.gpus_per_node and cluster.gpus_per_node % tp:
        problems.append(f"tp = {tp} groups would straddle nodes of {cluster.gpus_per_node} GPUs "
                        f"({cluster.gpus_per_node} % {tp} = {cluster.gpus_per_node % tp})")
    if model.n_layers % pp:
        problems.append(f"pp = {pp}: {model.n_layers} layers cannot be cut into {pp} equal stages "
                        f"({model.n_layers} = {pp} x {model.n_layers // pp} + {model.n_layers % pp})")
    if ep > 1:
        if not model.is_moe:
            problems.append(f"ep = {ep}: {model.name} is dense, it has no experts to spread")
        elif model.n_experts % ep:
            problems.append(f"ep = {ep}: {model.n_experts} experts cannot be spread evenly over {ep} ranks "
                            f"({model.n_experts} = {ep} x {model.n_experts // ep} + {model.n_experts % ep})")
        if (tp * dp) % ep:
            problems.append(f"ep = {ep} must divide the tp x dp = {tp} x {dp} = {tp * dp} ranks of a stage")
    if not problems:
        mem = memory_per_gpu(model, layout, workload)
        if mem.total_bytes > cluster.memory_per_gpu_bytes:
            problems.append(f"needs {_gb(mem.weights_bytes)} of weights + {_gb(mem.kv_cache_bytes)} of KV cache = "
                            f"{_gb(mem.total_bytes)} per GPU, more than the {_gb(cluster.memory_per_gpu_bytes)} "
                            "a GPU has")
    return problems


def check_layout(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> None:
    problems = layout_problems(model, cluster, layout, workload)
    if problems:
        raise ValueError(f"{layout.label} cannot serve {model.name} on {cluster.name}: " + "; ".join(problems))


# -- traffic: what one forward pass sends, per mesh axis (the real run in combined.py checks this) --------
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


def active_params_per_gpu(model: ModelConfig, layout: Layout) -> float:
    """Parameters one token touches on one GPU of a stage (embedding left out)."""
    router = model.d_model * model.n_experts if model.is_moe else 0
    dense = (model.attention_params_per_layer + 2 * model.d_model + router) / layout.tp
    experts = model.experts_per_token * model.expert_params / (layout.ep if layout.ep > 1 else layout.tp)
    return model.n_layers / layout.pp * (dense + experts)


def score(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> Score:
    """Decode latency, prefill time, throughput and bubble of a layout that passes every rule."""
    check_layout(model, cluster, layout, workload)
    mem = memory_per_gpu(model, layout, workload)
    m = workload.microbatches_for(layout.pp)
    tp_link = axis_link(cluster, tp_groups(layout))
    ep_link = axis_link(cluster, ep_groups(layout))
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
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
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
        lines.append(f"{s.layout.label:<22}{_gb(s.memory.total_bytes):>11}{s.decode_step_s * 1e3:>17.2f}"
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


# -- clusters ---------------------------------------------------------------------------------------------
ONE_NODE_8_H100 = Cluster("1 node x 8 H100 80GB", 1, 8, GPU_MEMORY_BYTES["H100 80GB"], NVLINK, INFINIBAND_400G)
TWO_NODES_8_H100 = Cluster("2 nodes x 8 H100 80GB", 2, 8, GPU_MEMORY_BYTES["H100 80GB"], NVLINK, INFINIBAND_400G)
ONE_H100 = Cluster("1 H100 80GB", 1, 1, GPU_MEMORY_BYTES["H100 80GB"], NVLINK, INFINIBAND_400G)
CLUSTERS: dict[str, Cluster] = {c.name: c for c in (ONE_H100, ONE_NODE_8_H100, TWO_NODES_8_H100)}

# How fast a laptop's CPU reads memory and multiplies, for the toy cluster's compute proxy: orders of
# magnitude, not measurements (the toy's time is dominated by the messages anyway).
CPU_MEMORY_BYTES_PER_S = 10e9
CPU_FLOPS_PER_S = 20e9


def toy_cluster(link: Link, memory_per_rank_bytes: float = 500e3, flops_per_s: float = CPU_FLOPS_PER_S) -> Cluster:
    """4 CPU ranks as 2 "nodes" of 2, every pair joined by ``link`` (one machine: a link measured here),
    computing at ``flops_per_s`` (measure it with ``combined.effective_flops_per_s``). The memory cap is
    chosen so that the toy model, like a real large one, does not fit on one rank."""
    return Cluster("4 CPU ranks (2 x 2)", 2, 2, memory_per_rank_bytes, link, link, CPU_MEMORY_BYTES_PER_S,
                   flops_per_s, "per_step")
