"""Does a model fit: on one GPU, with how much room left for KV cache; and how many GPUs it needs.

The lesson behind the usual "a 70B model does not fit one GPU": in bf16 its weights are 141 GB. That
is more than an 80 GB H100 and, by a hair, the 141 GB H200; the 180-256 GB class (NVIDIA B200, AMD
MI300X and MI325X) holds them, but the room left for the KV cache, which every sequence in flight
needs, is what decides how many users one GPU serves. Quantised weights (``ModelConfig.quantized``)
are the other way to fit. Numbers come from ``memory`` (the planner's own formulas), with a server
filling ``memory_utilization`` of each GPU. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import number_between, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import GPU
from shardlib.predict.serving.memory import kv_bytes_per_sequence, weights_per_gpu
from shardlib.predict.shapes import tensor_parallel_problems


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
