"""What each strategy keeps on a GPU and sends per training step, from formulas. Pure: no torch.

Rajbhandari et al. 2020 (ZeRO, section 3): mixed-precision Adam keeps 2 + 2 + 12 bytes a parameter
(``STATE_BYTES_MIXED``); Megatron-LM's fp32 gradients make it 2 + 4 + 12 (``STATE_BYTES_MEGATRON``); the toy
trains in 32-bit, 4 + 4 + 8::

    memory per rank   DDP (2+2+12) P, ZeRO-1 (2+2) P + 12 P/N, ZeRO-2 2 P + (2+12) P/N, ZeRO-3 (2+2+12) P/N
    bytes per step    DDP, ZeRO-1/2: 2 (N-1)/N P b;  ZeRO-3: 3 (N-1)/N P b  (ring convention)

``layout_*``: the same for real flat groups, padding included. Activations per layer (Korthikanti et al.
2022, Table 2): ``s b h (34 + 5 a s / h)``, ``34 s b h`` with the scores recomputed or never stored, ``2 s b h``
with full recomputation; ``mlp_activation_bytes`` for the toy's block. A stage's budget: ``training.memory``.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from shardlib.core.checks import choice, flag, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.data_parallel.flat import FlatGroup
from shardlib.core.mesh import DP_STRATEGIES
from shardlib.runtime.records import wire_bytes

STATE_BYTES_MIXED = {"params": 2, "grads": 2, "optimizer": 12}  # ZeRO's mixed-precision Adam: K = 12
STATE_BYTES_FP32 = {"params": 4, "grads": 4, "optimizer": 8}  # 32-bit AdamW: momentum and variance
STATE_BYTES_MEGATRON = {"params": 2, "grads": 4, "optimizer": 12}  # Megatron-LM: bf16 weights, fp32 gradients
MEMORY_KEYS = ("params", "grads", "optimizer")
SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("grads", "optimizer"),
           "zero3": ("params", "grads", "optimizer")}


def memory_per_rank(n_params: float, strategy: str, dp: int,
                    state_bytes: Mapping[str, float] = STATE_BYTES_MIXED) -> dict[str, float]:
    """Bytes one rank keeps between steps for ``n_params`` parameters: ``params``, ``grads``,
    ``optimizer`` and their ``total`` (the table in the module docstring)."""
    choice(strategy, DP_STRATEGIES, "strategy")
    dp = whole_number(dp, "dp (the data-parallel degree)")
    out = {k: n_params * state_bytes[k] / (dp if k in SHARDED[strategy] else 1) for k in MEMORY_KEYS}
    out["total"] = sum(out[k] for k in MEMORY_KEYS)
    return out


def step_wire_bytes(n_params: float, strategy: str, dp: int, value_bytes: float = 2) -> float:
    """Bytes one rank sends per training step (the table in the module docstring)."""
    choice(strategy, DP_STRATEGIES, "strategy")
    dp = whole_number(dp, "dp (the data-parallel degree)")
    passes = 3 if strategy == "zero3" else 2  # each pass moves (N-1)/N of the buffer
    return passes * (dp - 1) / dp * n_params * value_bytes


def zero_table(models: Sequence[ModelConfig], dp: int, state_bytes: Mapping[str, float] = STATE_BYTES_MIXED,
               value_bytes: float = 2) -> list[dict]:
    """One row per model and strategy: parameters, memory per rank (GB) and bytes sent per step (GB)."""
    rows = []
    for model in models:
        for strategy in DP_STRATEGIES:
            mem = memory_per_rank(model.n_params, strategy, dp, state_bytes)
            rows.append({"model": model.name, "strategy": strategy, "n_params": model.n_params, "dp": dp,
                         **{f"{k}_gb": mem[k] / 1e9 for k in (*MEMORY_KEYS, "total")},
                         "wire_gb_per_step": step_wire_bytes(model.n_params, strategy, dp, value_bytes) / 1e9})
    return rows


# -- the same quantities for a real model's flat groups -----------------------------------------------
def layout_memory(groups: Sequence[FlatGroup], strategy: str, element_bytes: int,
                  optimizer_states: int = 2) -> dict[str, int]:
    """Bytes one rank keeps between steps with these flat groups (padding included): the full buffers,
    or one shard of each where ``strategy`` shards that part. ``optimizer_states``: AdamW keeps two
    values per parameter (its 0-dimensional step counters are left out)."""
    choice(strategy, DP_STRATEGIES, "strategy")
    full = sum(g.padded_numel for g in groups) * element_bytes
    shard = sum(g.shard_numel for g in groups) * element_bytes
    per = {"params": 1, "grads": 1, "optimizer": optimizer_states}
    return {k: per[k] * (shard if k in SHARDED[strategy] else full) for k in MEMORY_KEYS}


def layout_step_bytes(groups: Sequence[FlatGroup], strategy: str, element_bytes: int,
                      dp: int) -> dict[str, dict[str, int]]:
    """Per op: ``count``, ``size_bytes`` and ``wire_bytes`` one rank moves in one step. Per bucket an
    all-reduce (DDP), or a reduce-scatter and an all-gather (ZeRO-1/2); per unit two all-gathers and a
    reduce-scatter (ZeRO-3)."""
    choice(strategy, DP_STRATEGIES, "strategy")
    per_group = {"ddp": ("all_reduce",), "zero3": ("all_gather", "all_gather", "reduce_scatter")}
    out: dict[str, dict[str, int]] = {}
    for op in per_group.get(strategy, ("reduce_scatter", "all_gather")):
        for g in groups:
            size = g.padded_numel * element_bytes
            row = out.setdefault(op, {"count": 0, "size_bytes": 0, "wire_bytes": 0})
            row["count"] += 1
            row["size_bytes"] += size
            row["wire_bytes"] += wire_bytes(op, size, dp)
    return out


def gathered_peak_bytes(groups: Sequence[FlatGroup], element_bytes: int, prefetch: bool) -> int:
    """ZeRO-3's transient peak: the most gathered parameters alive at once. One unit at a time without
    prefetch; with prefetch the next unit arrives while the current one works: the largest pair of
    neighbours."""
    sizes = [g.padded_numel * element_bytes for g in groups]
    if not prefetch or len(sizes) == 1:
        return max(sizes)
    return max(a + b for a, b in zip(sizes, sizes[1:]))


# -- activations, and a training GPU's whole budget ----------------------------------------------------
RECOMPUTE = ("none", "selective", "full")


def layer_activation_bytes(model: ModelConfig, seq: int, microbatch: int, recompute: str = "selective", tp: int = 1,
                           sequence_parallel: bool = False) -> float:
    """Bytes one layer keeps for its backward for one microbatch on one GPU (Korthikanti et al. 2022, section 4
    and Table 2; 16-bit activations, 1-byte dropout masks): without parallelism ``s b h (34 + 5 a s / h)``;
    with ``tp`` ways of tensor parallelism ``s b h (10 + 24 / t + 5 a s / (h t))`` (the norms' and dropouts'
    ``10 s b h`` stay whole on every GPU); with sequence parallelism too, ``s b h / t (34 + 5 a s / h)``.
    ``"none"`` stores attention's scores (the ``5 a s / h`` term); ``"selective"`` recomputes them, which is
    also what a fused attention kernel (FlashAttention) keeps without recomputing anything; ``"full"`` keeps
    only the layer's input, ``2 s b h`` (``/ t`` with sequence parallelism, which splits that input)."""
    choice(recompute, RECOMPUTE, "recompute")
    s, b, h, a = whole_number(seq, "seq"), whole_number(microbatch, "microbatch"), model.d_model, model.n_heads
    t = whole_number(tp, "tp (the tensor-parallel degree)")
    sp = flag(sequence_parallel, "sequence_parallel")
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sp else 1)
    scores = 5 * a * s / h if recompute == "none" else 0
    if sp:
        return sbh / t * (34 + scores)
    return sbh * (10 + 24 / t + scores / t)


def mlp_activation_bytes(rows: int, d_model: int, d_hidden: int, element_bytes: int = 4,
                         checkpoint: bool = False) -> int:
    """What one ``reference.ResidualMLP`` keeps for its backward: ``x``, ``up(x)`` and ``gelu(up(x))``,
    ``rows x (d_model + 2 d_hidden)`` values; with recomputation only its input, ``rows x d_model``."""
    return rows * (d_model if checkpoint else d_model + 2 * d_hidden) * element_bytes
