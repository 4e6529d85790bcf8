"""What a layout needs and whether it may: the workload, memory per GPU, the batch it affords, the rules.

Memory per GPU is the heaviest stage's weights (``shapes.stage_params_per_device``, the training planner's
too) plus the KV cache of its sequences in flight at the workload's context. A replica's batch, unless the
workload fixes it, is what the memory its weights leave free holds (``affordable_batch``), up to ``max_batch``
(256: vLLM's default ``max_num_seqs`` on an A100 or a smaller GPU; recent releases allow 1,024 on larger
ones such as the H100): splitting ``tp`` ways shrinks weights and each sequence's cache per GPU (the cache
only down to one KV head), so tensor parallelism's freed memory buys batch. Rules: whole query heads and
whole (or copied) KV heads per tp rank, ``d_ff`` divisible, tp groups inside a node, at least a layer per
stage, whole experts per ep rank, and memory; each rejection carries its numbers. ``kernel_efficiency``
scales the peak the cost model assumes (1.0: the floor). ``fit_on_gpus``, ``gpus_needed``: does a model fit
a GPU, with how much room for KV cache. In bf16 a 70B model's 141 GB of weights pass an 80 GB H100 and, by
a hair, the 141 GB H200; the 180-256 GB class (B200, MI300X, MI325X) holds them, but the room left for the
KV cache decides how many users one GPU serves. Quantised weights are the other way to fit. Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import flag, number_between, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, check_mesh
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import GPU, Cluster
from shardlib.predict.shapes import (
    Memory,
    attention_params_per_device,
    kv_cache_bytes,
    pipeline_parallel_problems,
    stage_layers,
    stage_params_per_device,
    tensor_parallel_problems,
)
from shardlib.predict.units import gb


@dataclass(frozen=True)
class Workload:
    """What is served. ``batch`` sequences in flight per replica (0: as many as free memory holds, up
    to ``max_batch``), each with a KV cache of ``context_tokens`` (the worst case: every sequence at
    full length); prefill runs ``prompt_tokens`` per sequence; a pipeline cuts the batch into
    ``microbatches`` (0: the planner chooses). A server fills at most ``memory_utilization`` of a GPU
    with weights and KV cache (vLLM's default ``gpu_memory_utilization`` is 0.9; the rest holds
    activations and the runtime). ``copy_kv_heads`` lets tp pass the KV heads by copying them (vLLM's
    way; False: the wall). ``kernel_efficiency`` is the share of peak memory bandwidth and FLOPs the
    kernels reach: 1.0 gives floors (no kernel reaches peak; decode kernels reach roughly 0.7 to 0.85)."""

    batch: int = 0
    context_tokens: int = 4096
    prompt_tokens: int = 2048
    microbatches: int = 0
    max_batch: int = 256
    memory_utilization: float = 0.9
    copy_kv_heads: bool = True
    kernel_efficiency: float = 1.0

    def __post_init__(self) -> None:
        whole_number(self.batch, "batch (0: sized from free memory)", minimum=0)
        whole_number(self.microbatches, "microbatches (0: the planner chooses)", minimum=0)
        for name in ("context_tokens", "prompt_tokens", "max_batch"):
            whole_number(getattr(self, name), name)
        number_between(self.memory_utilization, "memory_utilization (the share of a GPU's memory a server fills)",
                       0.01, 1.0)
        flag(self.copy_kv_heads, "copy_kv_heads")
        number_between(self.kernel_efficiency, "kernel_efficiency (the share of peak bandwidth and FLOPs kernels "
                       "reach; 1.0: the floor)", 0.05, 1.0)
        if self.prompt_tokens > self.context_tokens:
            raise ValueError(f"a prompt of {self.prompt_tokens} tokens does not fit a context of "
                             f"{self.context_tokens} tokens")

    def microbatches_for(self, pp: int, batch: int | None = None) -> int:
        """``m``: 1 without a pipeline (nothing to overlap), else ``microbatches`` (or ``pp`` when the
        planner chooses), never more than the sequences there are."""
        batch = self.batch if batch is None else batch
        if pp == 1:
            return 1
        return max(1, min(self.microbatches or pp, batch or pp))

    def usable_bytes(self, cluster: Cluster) -> float:
        return cluster.memory_per_gpu_bytes * self.memory_utilization


# -- memory -------------------------------------------------------------------------------------------
def weights_per_gpu(model: ModelConfig, layout: Layout) -> float:
    """Weight bytes on a GPU of the heaviest stage (``shapes.stage_params_per_device``): layer matrices at
    ``matrix_bytes_per_param``, the rest in the model's dtype."""
    return max(matrices * model.matrix_bytes_per_param + rest * model.bytes_per_param
               for matrices, rest in (stage_params_per_device(model, layout.tp, layout.pp, s, layout.ep)
                                      for s in range(layout.pp)))


def stack_weight_bytes(model: ModelConfig, layout: Layout) -> list[int]:
    """Per rank, the weights the combined run on ranks keeps (``layouts.build_stage``: blocks only, no
    embedding or head): per layer of its stage the attention's ``attention_params_per_device``, and a
    dense MLP split ``tp`` ways, or an MoE layer's router (whole) and its ``n_experts / ep`` whole experts."""
    check_mesh(layout, layout.world_size)
    if model.is_moe:
        mlp = model.d_model * model.n_experts + model.n_experts // layout.ep * model.expert_params
    else:
        mlp = model.expert_params / layout.tp
    per_layer = attention_params_per_device(model, layout.tp) + mlp
    stages = stage_layer_counts(model.n_layers, layout.pp)
    return [int(stages[layout.position(r).stage] * per_layer * model.bytes_per_param) for r in range(layout.world_size)]


def kv_bytes_per_sequence(model: ModelConfig, layout: Layout, context_tokens: int) -> float:
    """One sequence's KV cache on one GPU of a stage: its layers, its KV heads, every token of the context."""
    return kv_cache_bytes(model, context_tokens, tp=layout.tp, pp=layout.pp)


def affordable_batch(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> int:
    """Sequences a replica can hold: the memory its weights leave free over one sequence's cache, at
    most ``workload.max_batch`` (0 when not even one fits)."""
    free = workload.usable_bytes(cluster) - weights_per_gpu(model, layout)
    per_sequence = kv_bytes_per_sequence(model, layout, workload.context_tokens)
    return max(0, min(workload.max_batch, int(free // per_sequence))) if free > 0 else 0


def memory_per_gpu(model: ModelConfig, layout: Layout, workload: Workload, batch: int | None = None) -> Memory:
    """Bytes on a GPU of the heaviest stage for ``batch`` sequences (default: the workload's batch)."""
    batch = workload.batch if batch is None else batch
    return Memory(weights_per_gpu(model, layout), batch * kv_bytes_per_sequence(model, layout, workload.context_tokens))


# -- shape rules ----------------------------------------------------------------------------------------
def shape_problems(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> list[str]:
    """Every rule of shape and placement ``layout`` breaks (memory aside), each with its numbers."""
    check_mesh(layout, cluster.n_gpus)
    tp, pp, ep, dp = layout.tp, layout.pp, layout.ep, layout.dp
    problems = [f"tp = {tp}: {p}" for p in tensor_parallel_problems(model, tp, workload.copy_kv_heads)]
    if tp > model.n_kv_heads and not workload.copy_kv_heads and any("KV heads" in p for p in problems):
        problems[0:0] = [f"tp = {tp} exceeds the {model.n_kv_heads} KV heads (Workload(copy_kv_heads=False))"]
    if tp < cluster.gpus_per_node and cluster.gpus_per_node % tp:
        problems.append(f"tp = {tp} groups would straddle nodes of {cluster.gpus_per_node} GPUs "
                        f"({cluster.gpus_per_node} % {tp} = {cluster.gpus_per_node % tp})")
    problems += [f"pp = {pp}: {p}" for p in pipeline_parallel_problems(model, pp)]
    if ep > 1:
        if not model.is_moe:
            problems.append(f"ep = {ep}: {model.name} is dense, it has no experts to spread")
        elif model.n_experts % ep:
            problems.append(f"ep = {ep}: {model.n_experts} experts cannot be spread evenly over {ep} ranks "
                            f"({model.n_experts} = {ep} x {model.n_experts // ep} + {model.n_experts % ep})")
        if (tp * dp) % ep:
            problems.append(f"ep = {ep} must divide the tp x dp = {tp} x {dp} = {tp * dp} ranks of a stage")
    return problems


def memory_problem(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> str:
    """Why ``layout``'s memory does not hold the model and its batch ("" when it does), with the sum."""
    usable, total = workload.usable_bytes(cluster), cluster.memory_per_gpu_bytes
    share = f"{gb(usable)} a server fills of each {gb(total)} GPU ({workload.memory_utilization:.0%})"
    weights = weights_per_gpu(model, layout)
    per_sequence = kv_bytes_per_sequence(model, layout, workload.context_tokens)
    if workload.batch:
        mem = memory_per_gpu(model, layout, workload)
        if mem.total_bytes > usable:
            sequences = f"{workload.batch} sequence{'s' if workload.batch > 1 else ''}"
            tokens = f"{workload.context_tokens:,} token{'s' if workload.context_tokens > 1 else ''}"
            return (f"needs {gb(weights)} of weights + {gb(mem.kv_cache_bytes)} of KV cache ({sequences} x {tokens}) = "
                    f"{gb(mem.total_bytes)} per GPU, more than the {share}")
        return ""
    if weights > usable:
        return f"needs {gb(weights)} of weights per GPU, more than the {share}"
    if weights + per_sequence > usable:
        return (f"{gb(weights)} of weights leave {gb(usable - weights)} of the {share}, less than one sequence's "
                f"KV cache ({gb(per_sequence)} per GPU at {workload.context_tokens:,} tokens)")
    return ""


def layout_problems(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload) -> list[str]:
    """Every reason ``layout`` cannot serve ``model`` on ``cluster`` (empty: it can), each with its numbers:
    the shape rules, then (when those pass) memory."""
    problems = shape_problems(model, cluster, layout, workload)
    if not problems:
        problems = [p for p in [memory_problem(model, cluster, layout, workload)] if p]
    return problems


def check_layout(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> None:
    problems = layout_problems(model, cluster, layout, workload)
    if problems:
        raise ValueError(f"{layout.label} cannot serve {model.name} on {cluster.name}: " + "; ".join(problems))


def active_params_per_gpu(model: ModelConfig, layout: Layout) -> float:
    """Parameters one token touches on one GPU of a stage (embedding and head left out)."""
    router = model.d_model * model.n_experts if model.is_moe else 0
    dense = (model.attention_params_per_layer + 2 * model.d_model + router) / layout.tp
    experts = model.experts_per_token * model.expert_params / (layout.ep if layout.ep > 1 else layout.tp)
    return stage_layers(model, layout.pp) * (dense + experts)


# -- does a model fit -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class GpuFit:
    """``model`` split ``tp`` ways (tensor parallelism; 1: whole) on GPUs of type ``gpu``, per GPU."""

    model: str
    gpu: str
    tp: int
    context_tokens: int
    weights_bytes: float
    usable_bytes: float  # the GPU's memory x memory_utilization
    gpu_bytes: float
    kv_bytes_per_sequence: float  # one sequence's cache at context_tokens, this GPU's share

    @property
    def room_bytes(self) -> float:
        """What the weights leave for KV cache (negative: the weights alone do not fit)."""
        return self.usable_bytes - self.weights_bytes

    @property
    def sequences(self) -> int:
        """Sequences of ``context_tokens`` whose KV cache fits beside the weights."""
        return max(0, int(self.room_bytes // self.kv_bytes_per_sequence)) if self.room_bytes > 0 else 0

    @property
    def fits(self) -> bool:
        """The weights and at least one sequence's cache fit."""
        return self.sequences >= 1


def fit_on_gpus(model: ModelConfig, gpu: GPU, tp: int = 1, context_tokens: int = 4096,
                memory_utilization: float = 0.9) -> GpuFit:
    """How ``model`` split ``tp`` ways sits in each ``gpu``: weights, room, sequences of ``context_tokens``."""
    whole_number(tp, "tp")
    whole_number(context_tokens, "context_tokens")
    number_between(memory_utilization, "memory_utilization", 0.01, 1.0)
    layout = Layout(tp, 1)
    return GpuFit(model.name, gpu.name, tp, context_tokens, weights_per_gpu(model, layout),
                  gpu.memory_bytes * memory_utilization, gpu.memory_bytes,
                  kv_bytes_per_sequence(model, layout, context_tokens))


def gpus_needed(model: ModelConfig, gpu: GPU, context_tokens: int = 4096, sequences: int = 1,
                memory_utilization: float = 0.9, max_tp: int = 64) -> int | None:
    """The fewest GPUs of type ``gpu`` that hold ``model`` and ``sequences`` sequences of
    ``context_tokens``, split by tensor parallelism at a degree its shapes allow (None: none up to
    ``max_tp``)."""
    whole_number(sequences, "sequences")
    for tp in range(1, whole_number(max_tp, "max_tp") + 1):
        if not tensor_parallel_problems(model, tp):
            if fit_on_gpus(model, gpu, tp, context_tokens, memory_utilization).sequences >= sequences:
                return tp
    return None
