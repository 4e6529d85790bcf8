"""What training one layout costs: the workload, and one step's time on a cluster, term by term.

Each of ``dp`` replicas runs ``m`` microbatches of ``b`` sequences (``global batch = b x m x dp``).
**compute**: ``6 N`` FLOPs per token plus attention's ``12 L h s``, halved for a causal mask, plus
recomputation's, at ``kernel_efficiency`` of peak, the heaviest stage setting the pace; **bubble**: the
registry's published idle; **tp** (exposed): sequence parallelism's gathers and scatters; **cp**: the ring's
K/V hidden behind attention up to its time; **dp** over the ``dp x cp`` ranks holding the same weights (DDP
and ZeRO-1 once a step but for the last bucket, ZeRO-2 every microbatch plus a weight gather, ZeRO-3 two
gathers and a reduce-scatter per microbatch behind its compute, the first gather exposed; experts over
their own holders); **pp**: the first and last microbatches' hops; **ep**: the experts' all-to-alls
(``ep_all_to_all_s``), exposed unless ``ep_overlap``; **optimizer**: AdamW's pass. **Latency**: every
collective pays alpha once per ring step (``n - 1`` over ``n`` ranks: NCCL's ring), so a ZeRO-3 gather over
2,048 replicas pays 2,047 latencies. A model: no kernel launch, no imbalance but the heaviest stage's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlib.core.checks import choice, flag, number_between, whole_number
from shardlib.core.config import ModelConfig, kv_bytes_per_token
from shardlib.core.mesh import DP_STRATEGIES, Layout
from shardlib.core.pipeline.registry import schedule_spec
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import LATENCY_CHARGES, Cluster, Link
from shardlib.predict.alpha_beta import collective_time_s, point_to_point_s
from shardlib.predict.bubbles import OpCosts, published_idle_s
from shardlib.predict.data_parallel import RECOMPUTE
from shardlib.predict.experts import ep_group_nodes, expert_all_to_all
from shardlib.predict.pipeline import stage_imbalance
from shardlib.predict.training.memory import (
    MEGATRON_SCHEDULES,
    TrainingMemory,
    expert_dp,
    peak_training_memory,
)


@dataclass(frozen=True)
class TrainingWorkload:
    """What is trained, and what the planner may choose. Sequences of ``sequence_tokens``, ``global_batch_tokens``
    a step (whole sequences); at most ``memory_utilization`` of each GPU for states and activations; the
    ``recompute``, ``microbatch_sizes``, ``dp_strategies`` to try; the registry's ``schedule`` ("1f1b" or
    "interleaved-1f1b" with ``chunks`` per GPU); states at Megatron-LM's 2 + 4 + 12 bytes per parameter
    (``memory``); ``kernel_efficiency``, the share of BF16 peak kernels reach (0.5; large matmuls reach
    0.6 to 0.75). ``min_ring_slice_tokens``: the shortest ring slice cp may cut (small shapes starve kernels;
    Llama 3 used no cp at 8K, 16 at 128K). ``comm_bytes_per_value``: bytes a collective moves per value.
    ``optimizer_bytes_per_param``: AdamW's traffic per updated parameter at memory bandwidth (0: none).
    ``dp_overlap``: data-parallel collectives behind compute (DDP's buckets, ZeRO-3's prefetch).
    ``comm_in_bubble``: a bubble slot also lasts a microbatch's exposed tp and cp time (default: compute only,
    as published plans count). ``lighter_ends``: Llama 3's lighter end stages. ``ep_overlap``: all-to-alls
    under another microbatch's compute (DualPipe). ``latency_charge``: alpha per ring step or per call."""

    sequence_tokens: int = 8192
    global_batch_tokens: int = 2048 * 8192
    memory_utilization: float = 0.9
    recompute: tuple[str, ...] = ("selective", "full")
    microbatch_sizes: tuple[int, ...] = (1, 2, 4)
    dp_strategies: tuple[str, ...] = DP_STRATEGIES
    schedule: str = "1f1b"
    chunks: int = 2
    sequence_parallel: bool = True
    kernel_efficiency: float = 0.5
    min_ring_slice_tokens: int = 4096
    comm_bytes_per_value: float = 2.0
    optimizer_bytes_per_param: float = 0.0
    dp_overlap: bool = True
    comm_in_bubble: bool = False
    lighter_ends: bool = False
    latency_charge: str = "per_step"
    ep_overlap: bool = False

    def __post_init__(self) -> None:
        s = whole_number(self.sequence_tokens, "sequence_tokens (tokens per sequence)")
        g = whole_number(self.global_batch_tokens, "global_batch_tokens (tokens per optimizer step)")
        if g % s:
            raise ValueError(f"a global batch of {g:,} tokens is not a whole number of sequences of {s:,} tokens "
                             f"({g:,} / {s:,} = {g / s:,.2f}): make global_batch_tokens a multiple of sequence_tokens")
        number_between(self.memory_utilization, "memory_utilization (the share of a GPU's memory training fills)",
                       0.05, 1.0)
        for name, allowed in (("recompute", RECOMPUTE), ("dp_strategies", DP_STRATEGIES)):
            values = getattr(self, name)
            if not isinstance(values, tuple) or not values:
                raise ValueError(f"{name} must be a non-empty tuple of {allowed}, got {values!r}")
            for v in values:
                choice(v, allowed, name)
        if not isinstance(self.microbatch_sizes, tuple) or not self.microbatch_sizes:
            raise ValueError("microbatch_sizes must be a non-empty tuple of whole numbers, got "
                             f"{self.microbatch_sizes!r}")
        for b in self.microbatch_sizes:
            whole_number(b, "a microbatch size (sequences per microbatch)")
        choice(self.schedule, MEGATRON_SCHEDULES, "schedule")
        whole_number(self.chunks, "chunks (model chunks per GPU, interleaved schedule)")
        number_between(self.kernel_efficiency, "kernel_efficiency (the share of peak FLOPs kernels reach)", 0.05, 1.0)
        whole_number(self.min_ring_slice_tokens, "min_ring_slice_tokens (the shortest slice cp may cut)")
        number_between(self.comm_bytes_per_value, "comm_bytes_per_value (bytes per value on the wire)", 0.5, 8.0)
        number_between(self.optimizer_bytes_per_param, "optimizer_bytes_per_param", 0.0, 1e3)
        for name in ("sequence_parallel", "dp_overlap", "comm_in_bubble", "lighter_ends", "ep_overlap"):
            flag(getattr(self, name), name)
        choice(self.latency_charge, LATENCY_CHARGES, "latency_charge")

    @property
    def sequences(self) -> int:
        """Sequences per optimizer step."""
        return self.global_batch_tokens // self.sequence_tokens

    def usable_bytes(self, cluster: Cluster) -> float:
        return cluster.memory_per_gpu_bytes * self.memory_utilization

    def memory(self, model: ModelConfig, layout: Layout, microbatch: int, n_microbatches: int,
               recompute: str) -> TrainingMemory:
        """The fullest stage's bytes per GPU (``peak_training_memory``) under this workload's settings."""
        return peak_training_memory(model, layout, self.sequence_tokens, microbatch, n_microbatches,
                                    recompute=recompute, sequence_parallel=self.sequence_parallel,
                                    schedule=self.schedule, chunks=self.chunks, lighter_ends=self.lighter_ends)


@dataclass(frozen=True)
class TrainingScore:
    """One layout's best configuration (``b`` x ``m`` per replica, ``recompute``, the fullest stage's memory)
    and its step term by term (exposed seconds), tokens per second and MFU."""

    layout: Layout
    microbatch: int
    n_microbatches: int
    recompute: str
    memory: TrainingMemory
    compute_s: float
    bubble_s: float
    tp_s: float
    cp_s: float
    dp_s: float
    pp_s: float
    tokens_per_s: float
    mfu: float
    links: dict = field(default_factory=dict, compare=False)  # axis -> link name
    reasons: tuple[str, ...] = ()
    optimizer_s: float = 0.0  # AdamW's pass, when the workload counts it
    ep_s: float = 0.0  # the experts' all-to-alls, exposed (ep > 1)

    @property
    def step_s(self) -> float:
        return (self.compute_s + self.bubble_s + self.tp_s + self.cp_s + self.dp_s + self.pp_s + self.optimizer_s
                + self.ep_s)


def model_flops_per_token(model: ModelConfig, seq: int, causal: bool = True) -> float:
    """Forward and backward: ``6 N`` over the matrices a token multiplies, plus attention's ``12 L h s``,
    halved when ``causal`` (Narayanan et al. count it whole: ``causal=False``)."""
    matrix = model.active_params_per_token - model.vocab_size * model.d_model - model.d_model
    return 6 * matrix + 12 * model.n_layers * model.d_model * seq * (0.5 if causal else 1.0)


def recompute_flops_per_token(model: ModelConfig, seq: int, recompute: str, causal: bool = True) -> float:
    """What recomputation adds: a whole forward (full) or attention's core (selective)."""
    attention = 4 * model.n_layers * model.d_model * seq * (0.5 if causal else 1.0)
    if recompute == "full":
        return (model_flops_per_token(model, seq, causal) - 3 * attention) / 3 + attention
    return attention if recompute == "selective" else 0.0


def heaviest_stage_share(model: ModelConfig, pp: int, seq: int, lighter_ends: bool = False) -> float:
    """The slowest stage's FLOPs over the mean stage's (``stage_imbalance``), the head on the last stage."""
    counts = stage_layer_counts(model.n_layers, pp, end_layers=int(lighter_ends))
    layer = (model_flops_per_token(model, seq) - 6 * model.vocab_size * model.d_model) / model.n_layers
    head = 6 * model.vocab_size * model.d_model
    stages = [c * layer + (head if i == pp - 1 else 0.0) for i, c in enumerate(counts)]
    return stage_imbalance(stages)


def _span_link(cluster: Cluster, span: int, size: int) -> Link:
    """The link of a group of ``size`` ranks over blocks of ``span`` consecutive ranks."""
    g = cluster.gpus_per_node
    inside = size == 1 or (span <= g and g % span == 0)
    return cluster.intra_link if inside else cluster.inter_link


def axis_links(cluster: Cluster, layout: Layout) -> dict[str, Link]:
    """The link each axis uses (Megatron's order: tp, cp, dp, pp outermost; the expert group and its
    data-parallel group with ``ep > 1``)."""
    t, c, d, p = layout.tp, layout.cp, layout.dp, layout.pp
    links = {"tp": _span_link(cluster, t, t), "cp": _span_link(cluster, t * c, c),
             "dp": _span_link(cluster, t * c * d, d * c), "pp": _span_link(cluster, t * c * d * p, p)}
    if layout.ep > 1:
        links["ep"] = _span_link(cluster, layout.ep, layout.ep)
        links["expert_dp"] = _span_link(cluster, t * c * d, expert_dp(layout))
    return links


def ep_all_to_all_s(model: ModelConfig, cluster: Cluster, layout: Layout, workload: TrainingWorkload,
                    microbatch: int) -> float:
    """One MoE layer's dispatch (or combine) for one microbatch on one rank (``predict.experts``)."""
    if layout.ep == 1:
        return 0.0
    tokens = workload.sequence_tokens // layout.cp * microbatch
    if workload.sequence_parallel and layout.tp > 1:
        tokens /= layout.tp
    nodes = ep_group_nodes(layout.ep, cluster.gpus_per_node)
    return expert_all_to_all(tokens, model.d_model, model.experts_per_token, layout.ep, nodes,
                             cluster.intra_link, cluster.inter_link, workload.comm_bytes_per_value, model.node_limit,
                             workload.latency_charge).seconds


def score_training(model: ModelConfig, cluster: Cluster, layout: Layout, workload: TrainingWorkload, microbatch: int,
                   recompute: str, memory: TrainingMemory | None = None) -> TrainingScore:
    """One step of ``layout``, term by term (the module docstring's model)."""
    w, lay = workload, layout
    s, b = w.sequence_tokens, microbatch
    m = w.sequences // (lay.dp * b)
    n = lay.world_size
    memory = memory or w.memory(model, lay, b, m, recompute)
    links = axis_links(cluster, lay)
    rate = cluster.peak_flops_per_s * w.kernel_efficiency
    layers = max(stage_layer_counts(model.n_layers, lay.pp, end_layers=int(w.lighter_ends)))
    heaviest = heaviest_stage_share(model, lay.pp, s, w.lighter_ends)
    flops = model_flops_per_token(model, s) + recompute_flops_per_token(model, s, recompute)
    compute = w.global_batch_tokens * flops / (n * rate) * heaviest
    per_mb = compute / m
    vb = w.comm_bytes_per_value
    act = s // lay.cp * b * model.d_model * vb  # one microbatch's layer input, whole
    charge = w.latency_charge
    passes = 3 if recompute == "full" else 2  # forward, backward, and the recomputed forward
    tp = 0.0
    if lay.tp > 1:
        if w.sequence_parallel:
            one = (collective_time_s("all_gather", act, lay.tp, links["tp"], charge)
                   + collective_time_s("reduce_scatter", act, lay.tp, links["tp"], charge))
        else:
            one = collective_time_s("all_reduce", act, lay.tp, links["tp"], charge)
        tp = 2 * one * passes * layers * m
    cp = 0.0
    if lay.cp > 1:
        kv = kv_bytes_per_token(1, model.n_kv_heads, model.head_dim, vb, lay.tp) * (s // lay.cp) * b  # a layer
        ring = 3 * (lay.cp - 1) * point_to_point_s(kv, links["cp"])
        attention = 12 * model.d_model * s * (s // lay.cp) * b / lay.tp / rate / 2  # causal: half the scores
        cp = max(0.0, ring - attention) * layers * m
    slot = per_mb + ((tp + cp) / m if w.comm_in_bubble else 0.0)  # one microbatch's turn on a stage
    spec = schedule_spec(w.schedule)
    chunk_op = slot / spec.n_chunks(w.chunks) / 3  # one chunk's F, B and W, a third of its turn each (Qi's F = B = W)
    bubble = published_idle_s(w.schedule, lay.pp, OpCosts(chunk_op, chunk_op, chunk_op))  # (p-1)(F+B+W): p - 1 turns
    dp = 0.0
    ranks = lay.dp * lay.cp
    edp = expert_dp(lay)
    if ranks > 1 or (memory.expert_params and edp > 1):
        rs = ag = 0.0
        # one layer's gradients (or weights): one collective each; the experts' over their own group
        for params, group, link in ((memory.params - memory.expert_params, ranks, links["dp"]),
                                    (memory.expert_params, edp, links.get("expert_dp"))):
            if params and group > 1:
                rs += layers * collective_time_s("reduce_scatter", params * vb / layers, group, link, charge)
                ag += layers * collective_time_s("all_gather", params * vb / layers, group, link, charge)
        backward = per_mb * 2 / 3
        if not w.dp_overlap:  # every collective after (or before) the compute it serves: nothing hidden
            dp = {"ddp": rs + ag, "zero1": rs + ag, "zero2": m * rs + ag}.get(lay.dp_strategy, m * (2 * ag + rs))
        elif lay.dp_strategy in ("ddp", "zero1"):  # once per step, behind the last microbatch's backward
            dp = max(rs + ag - backward, (rs + ag) / layers)
        elif lay.dp_strategy == "zero2":  # gradients reduced every microbatch; weights gathered after the step
            dp = m * max(rs - backward, rs / layers) + ag
        else:  # weights gathered before each forward and backward, gradients reduced, every microbatch:
            # prefetching hides a layer's gathers behind the layer before it, never the first layer's gather
            # of each pass, nor what passes the compute (a ring's n - 1 latencies over thousands of replicas)
            dp = m * (max(2 * ag + rs - per_mb, 0.0) + (2 * ag + rs) / layers)
    pp = 0.0
    if lay.pp > 1:
        hop = act / (lay.tp if w.sequence_parallel else 1)
        pp = 2 * (lay.pp - 1) * point_to_point_s(hop, links["pp"])
    ep = 0.0
    if lay.ep > 1:
        layer = 2 * passes * ep_all_to_all_s(model, cluster, lay, w, b)  # dispatch and combine, one layer
        ep = layers * m * (max(0.0, layer - per_mb / layers) if w.ep_overlap else layer)
    shards = (1, 1) if lay.dp_strategy == "ddp" else (ranks, edp)  # ZeRO: each rank updates its shard
    updated = (memory.params - memory.expert_params) / shards[0] + memory.expert_params / shards[1]
    optimizer = updated * w.optimizer_bytes_per_param / cluster.memory_bytes_per_s
    step = compute + bubble + tp + cp + dp + pp + optimizer + ep
    mfu = w.global_batch_tokens * model_flops_per_token(model, s) / (step * n * cluster.peak_flops_per_s)
    return TrainingScore(lay, b, m, recompute, memory, compute, bubble, tp, cp, dp, pp, w.global_batch_tokens / step,
                         mfu, {k: v.name for k, v in links.items()}, optimizer_s=optimizer, ep_s=ep)
