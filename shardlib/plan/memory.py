"""What a layout needs and whether it may: the workload, memory per GPU, and the shape rules.

**Memory per GPU** (the heaviest stage; activations and framework overhead are left out)::

    weights = L/pp x (attention + norms + router) / tp x b
            + L/pp x n_experts x expert / (ep if ep > 1 else tp) x b
            + copies x vocab x d_model / tp x b        (copies: 2 untied or 1 tied with pp = 1; 1 with pp > 1)
    kv      = 2 x L/pp x (n_kv_heads / tp) x head_dim x b x batch x context_tokens

with ``b`` bytes per value and ``batch`` the sequences in flight per replica. With ``ep = 1`` the experts
are sliced ``tp`` ways like a dense MLP (what Mixtral deployments with plain tensor parallelism do).

**Shape rules**: whole KV heads and query heads per tp rank, ``d_ff`` and the vocabulary divisible,
tp groups that do not straddle nodes, equal stages, whole experts per ep rank, and memory. Each
rejection carries its numbers. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import whole_number
from ..hardware import Cluster
from ..models import ModelConfig, tensor_parallel_problems
from .layout import Layout, check_mesh


def gb(size_bytes: float) -> str:
    """Bytes in GB (or kB below 0.1 GB), as the planner prints them."""
    return f"{size_bytes / 1e9:.1f} GB" if size_bytes >= 1e8 else f"{size_bytes / 1e3:,.0f} kB"


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
            problems.append(f"needs {gb(mem.weights_bytes)} of weights + {gb(mem.kv_cache_bytes)} of KV cache = "
                            f"{gb(mem.total_bytes)} per GPU, more than the {gb(cluster.memory_per_gpu_bytes)} "
                            "a GPU has")
    return problems


def check_layout(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> None:
    problems = layout_problems(model, cluster, layout, workload)
    if problems:
        raise ValueError(f"{layout.label} cannot serve {model.name} on {cluster.name}: " + "; ".join(problems))


def active_params_per_gpu(model: ModelConfig, layout: Layout) -> float:
    """Parameters one token touches on one GPU of a stage (embedding left out)."""
    router = model.d_model * model.n_experts if model.is_moe else 0
    dense = (model.attention_params_per_layer + 2 * model.d_model + router) / layout.tp
    experts = model.experts_per_token * model.expert_params / (layout.ep if layout.ep > 1 else layout.tp)
    return model.n_layers / layout.pp * (dense + experts)
