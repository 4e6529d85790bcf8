"""Published memory figures, each beside this package's memory model: rows a notebook prints.

* ZeRO (Rajbhandari et al. 2020), Figure 1: 7.5B parameters, ``Nd = 64``, ``K = 12``: ``(2 + 2 + K) P``
  for the baseline, then ZeRO's three stages (``zero_figure_rows``).
* Megatron-LM's docs (``docs/source/api-guide/dist_optimizer.md``): bytes per parameter per dtype, e.g.
  bf16 weights and fp32 gradients, 18 without and ``6 + 12/d`` with its distributed optimizer.
* DeepSpeed's ``estimate_zero3_model_states_mem_needs`` (``deepspeed/runtime/zero/stage3.py``), its
  arithmetic in our words (``deepspeed_zero3_estimate``), for the same 7.5B on 8 nodes of 8 GPUs, in GiB.
* Korthikanti et al. 2022, Table 2: one layer's activations for their 530B model (``activation_rows``).

Where the sources count different things, each row's ``note`` says what. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.config import ModelConfig
from shardlib.predict.data_parallel import (
    STATE_BYTES_FP32,
    STATE_BYTES_MEGATRON,
    STATE_BYTES_MIXED,
    layer_activation_bytes,
    memory_per_rank,
)

ZERO_PAPER_PARAMS = 7.5e9  # ZeRO, Figure 1: a 7.5B-parameter model on 64 GPUs
ZERO_PAPER_DP = 64
# ZeRO's Figure 1 in GB, as printed (1 GB = 1e9 bytes): the baseline and its stages Pos, Pos+g, Pos+g+p
ZERO_FIGURE_1_GB = {"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}
ZERO_STAGE_NAMES = {"ddp": "baseline (DDP)", "zero1": "Pos (ZeRO-1)", "zero2": "Pos+g (ZeRO-2)",
                    "zero3": "Pos+g+p (ZeRO-3)"}
# Korthikanti et al. 2022's 530B GPT model (their Table 3): 105 layers, h = 20480, 128 heads, s = 2048,
# trained with tp = 8 (x pp = 35 x dp = 8 = the abstract's 2,240 A100s), microbatch 1.
GPT_530B = ModelConfig("GPT-530B", n_layers=105, d_model=20480, n_heads=128, n_kv_heads=128, d_ff=4 * 20480,
                       vocab_size=51200)


@dataclass(frozen=True)
class FigureRow:
    """One published figure beside ours: ``what``, the ``published`` and ``ours`` values in ``unit``, and
    why they differ (or agree)."""

    source: str
    what: str
    published: float
    ours: float
    unit: str
    note: str = ""

    @property
    def agrees(self) -> bool:
        """Equal to the published figure's printed precision (one decimal)."""
        return abs(round(self.ours, 1) - self.published) < 0.051


def zero_figure_rows(n_params: float = ZERO_PAPER_PARAMS, dp: int = ZERO_PAPER_DP) -> list[FigureRow]:
    """ZeRO's Figure 1: memory per GPU for model states, ``memory_per_rank`` with ``STATE_BYTES_MIXED``."""
    rows = []
    for strategy, paper in ZERO_FIGURE_1_GB.items():
        ours = memory_per_rank(n_params, strategy, dp, STATE_BYTES_MIXED)["total"] / 1e9
        rows.append(FigureRow("ZeRO, Figure 1", ZERO_STAGE_NAMES[strategy], paper, ours, "GB",
                              "2 + 2 + 12 bytes per parameter; the sharded parts divided by Nd = 64"))
    return rows


# Megatron-LM's table (dist_optimizer.md), one row per (weights, gradients) dtype: the bytes each keeps per
# parameter and, of those, the bytes its distributed optimizer shards. fp16/bf16 weights: the optimizer
# keeps an fp32 master copy and two moments (12), and with 16-bit gradients an fp32 copy of them too (4).
MEGATRON_TABLE = {"float16 param, float16 grads": ({"params": 2, "grads": 2, "optimizer": 16}, 20, (4, 16)),
                  "float16 param, fp32 grads": (STATE_BYTES_MEGATRON, 18, (6, 12)),
                  "fp32 param, fp32 grads": (STATE_BYTES_FP32, 16, (8, 8))}


def megatron_rows(dp: int = ZERO_PAPER_DP) -> list[FigureRow]:
    """Megatron-LM's bytes per parameter without and with its distributed optimizer (``a + b/d``), each dtype
    row of its table, from ``memory_per_rank``; then ZeRO's convention beside them."""
    rows = []
    for what, (state, plain, (kept, sharded)) in MEGATRON_TABLE.items():
        rows.append(FigureRow("Megatron-LM dist_optimizer.md", f"{what}: bytes/parameter", plain,
                              memory_per_rank(1, "ddp", dp, state)["total"], "bytes",
                              f"{' + '.join(str(v) for v in state.values())}: weights, gradients, optimizer state"))
        rows.append(FigureRow("Megatron-LM dist_optimizer.md", f"{what}: distributed optimizer, d = {dp}",
                              kept + sharded / dp, memory_per_rank(1, "zero1", dp, state)["total"], "bytes",
                              f"{kept} + {sharded}/d: the optimizer state sharded over d (ZeRO-1), weights and "
                              "gradients whole"))
    rows.append(FigureRow("ZeRO, section 3.1", "mixed-precision Adam: bytes/parameter", 16,
                          memory_per_rank(1, "ddp", dp, STATE_BYTES_MIXED)["total"], "bytes",
                          "2 (fp16 weights) + 2 (fp16 gradients) + K = 12 (fp32 copy, momentum, variance); "
                          "Megatron's 18 keeps its gradients in fp32 (4 bytes), to accumulate them over "
                          "microbatches without rounding"))
    return rows


def deepspeed_zero3_estimate(total_params: float, largest_layer_params: float, gpus_per_node: int = 1,
                             nodes: int = 1, cpu_offload: bool = True, cpu_offload_params: bool = True,
                             zero_init: bool = True, additional_buffer_factor: float = 1.5) -> dict[str, float]:
    """DeepSpeed's ``estimate_zero3_model_states_mem_needs`` in our words: bytes per GPU and per node's CPU.

    Every GPU keeps 4 bytes per parameter of its largest layer, the one gathered whole to run. With
    nothing offloaded it also keeps ``18 / n_gpus`` bytes per parameter; offloading the optimizer keeps
    ``2 / n_gpus`` (its fp16 weight shard); offloading weights too keeps nothing more. The CPU of each node
    holds, per parameter, 18 (weights offloaded) or 16 (optimizer only) bytes over the nodes (``zero_init``:
    built sharded) or at least 4 bytes per GPU of the node (built whole on every process first), and
    without offload only the largest layer per GPU; CPU figures carry ``additional_buffer_factor``."""
    n_gpus = gpus_per_node * nodes
    per_node = 1 / nodes
    largest = 4 * largest_layer_params
    if cpu_offload and cpu_offload_params:
        gpu, per_param = largest, 18
    elif cpu_offload:
        gpu, per_param = largest + int(2 * total_params / n_gpus), 16
    else:
        gpu = largest + int(18 * total_params / n_gpus)
        cpu = (largest_layer_params if zero_init else total_params) * 4 * gpus_per_node * additional_buffer_factor
        return {"gpu_bytes": gpu, "cpu_bytes": int(cpu)}
    if zero_init:
        cpu = total_params * per_param * per_node * additional_buffer_factor
    else:
        cpu = total_params * max(4 * gpus_per_node, per_param * per_node) * additional_buffer_factor
    return {"gpu_bytes": gpu, "cpu_bytes": int(cpu)}


# The ZeRO paper's 7.5B model is GPT-2-like; assume d_model = 4096, so its largest matrix (the MLP's
# 4h x h) has 4 x 4096^2 = 67.1M parameters (DeepSpeed's "largest layer": one module's own parameters).
ZERO_PAPER_LARGEST_LAYER = 4 * 4096 ** 2


def deepspeed_rows(n_params: float = ZERO_PAPER_PARAMS, dp: int = ZERO_PAPER_DP,
                   largest_layer_params: float = ZERO_PAPER_LARGEST_LAYER, gpus_per_node: int = 8) -> list[FigureRow]:
    """DeepSpeed's estimate for ZeRO-3 on ``dp`` GPUs without offload, beside ours and ZeRO's figure."""
    gib = 2 ** 30  # DeepSpeed prints GiB ("GB" in its table: bytes / 2**30)
    est = deepspeed_zero3_estimate(n_params, largest_layer_params, gpus_per_node, dp // gpus_per_node,
                                   cpu_offload=False)
    offload = deepspeed_zero3_estimate(n_params, largest_layer_params, gpus_per_node, dp // gpus_per_node)
    ours = memory_per_rank(n_params, "zero3", dp, STATE_BYTES_MIXED)["total"]
    return [FigureRow("DeepSpeed stage3.py", "ZeRO-3 per GPU, no offload", est["gpu_bytes"] / gib, ours / gib, "GiB",
                      f"DeepSpeed counts 18 bytes per parameter over the {dp} GPUs (2 more than ZeRO's 16; the code "
                      f"does not itemise them) plus 4 bytes per parameter of the largest layer, gathered whole "
                      f"({4 * largest_layer_params / gib:.2f} GiB for a {largest_layer_params / 1e6:.0f}M-parameter "
                      "matrix, assumed); ours and ZeRO's Figure 1 count the 16 bytes of model states only"),
            FigureRow("DeepSpeed stage3.py", "ZeRO-3 per node's CPU, no offload", est["cpu_bytes"] / gib, 0.0, "GiB",
                      "with zero_init each GPU's largest layer passes through the CPU, times the buffer factor 1.5 "
                      "(DeepSpeed applies it to CPU figures only); our model keeps nothing on the CPU"),
            FigureRow("DeepSpeed stage3.py", "ZeRO-3 per node's CPU, weights and optimizer offloaded",
                      offload["cpu_bytes"] / gib, 18 * n_params / (dp // gpus_per_node) / gib, "GiB",
                      "18 bytes per parameter over the nodes, times 1.5 for buffers; ours: the 18 bytes alone")]


def activation_rows(model: ModelConfig = GPT_530B, seq: int = 2048, microbatch: int = 1,
                    tp: int = 8) -> list[FigureRow]:
    """Korthikanti et al.'s Table 2 evaluated for ``model`` (their 530B, tp = 8): one layer's activations
    in MB, the paper's formula (in ``s b h`` units) beside ``layer_activation_bytes``."""
    s, b, h, a, t = seq, microbatch, model.d_model, model.n_heads, tp
    sbh = s * b * h
    cases = [("no parallelism", sbh * (34 + 5 * a * s / h), "none", 1, False),
             ("tensor parallel", sbh * (10 + 24 / t + 5 * a * s / (h * t)), "none", t, False),
             ("tensor + sequence parallel", sbh / t * (34 + 5 * a * s / h), "none", t, True),
             ("tensor parallel + selective recompute", sbh * (10 + 24 / t), "selective", t, False),
             ("tensor + sequence parallel + selective recompute", sbh * 34 / t, "selective", t, True),
             ("full recompute", 2 * sbh, "full", t, False)]
    return [FigureRow("Korthikanti et al. 2022, Table 2 (formula evaluated)", f"{model.name} layer, {what}",
                      paper / 1e6,
                      layer_activation_bytes(model, s, b, rec, tt, sp) / 1e6, "MB",
                      f"s = {s}, b = {b}, h = {h}, a = {a}, t = {t}")
            for what, paper, rec, tt, sp in cases]


def published_rows() -> list[FigureRow]:
    """Every published figure beside ours."""
    return zero_figure_rows() + megatron_rows() + deepspeed_rows() + activation_rows()
