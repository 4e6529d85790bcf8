"""Memory per device against sequence length: weights and KV cache under ``tp x cp``, one ring rank's
holdings, and the toy block's saved activations under sequence parallelism.

The KV cache per device is ``predict.shapes.kv_cache_bytes``: tensor parallelism splits it by KV head and stops
at the KV-head wall (``predict.shapes.kv_heads_per_device``); context parallelism splits it by token, ``1/cp``.
The toy block's tally follows Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models"), counted for torch's CPU attention kernel in float32. Pure: no torch.
"""

from __future__ import annotations

from shardlib.core.checks import flag, positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.context_parallel.placement import check_sequence
from shardlib.predict.context_parallel import AttentionShape
from shardlib.predict.shapes import Memory, kv_cache_bytes


def _degrees(tp: int, cp: int) -> tuple[int, int]:
    return whole_number(tp, "tp"), whole_number(cp, "cp")


def device_memory(model: ModelConfig, seq: int, batch: int = 1, tp: int = 1, cp: int = 1) -> Memory:
    """Weights and KV cache on one device of a ``tp x cp`` layout (the planner's ``Memory``): the
    weights split ``tp`` ways and copied on every context-parallel rank, the cache split both ways."""
    tp, cp = _degrees(tp, cp)
    return Memory(model.weight_bytes / tp, kv_cache_bytes(model, seq, batch, tp, cp))


def context_parallel_needed(model: ModelConfig, seq: int, memory_per_device_bytes: float, batch: int = 1,
                            tp: int = 1, max_cp: int = 64) -> int:
    """The smallest ``cp`` (a power of two up to ``max_cp``) at which ``seq`` tokens' KV cache and the
    weights fit in ``memory_per_device_bytes`` with ``tp``-way tensor parallelism; a ValueError with
    the numbers when none does (the weights alone may not fit: then no ``cp`` helps)."""
    cap = positive_number(memory_per_device_bytes, "memory_per_device_bytes")
    cp = 1
    while cp <= max_cp:
        if device_memory(model, seq, batch, tp, cp).total_bytes <= cap:
            return cp
        cp *= 2
    best = device_memory(model, seq, batch, tp, max_cp)
    raise ValueError(f"{model.name} with tp = {tp} and {seq:,} tokens does not fit {cap / 1e9:.0f} GB per device "
                     f"even at cp = {max_cp}: weights {best.weights_bytes / 1e9:.1f} GB + KV cache "
                     f"{best.kv_cache_bytes / 1e9:.1f} GB")


def toy_block_activation_bytes(model: ModelConfig, batch: int, seq: int, tp: int = 1,
                               sequence_parallel: bool = False, bytes_per_value: float = 4.0) -> float:
    """What autograd keeps for one toy block's backward on one rank, ``T = batch x seq`` tokens::

        outside the pairs  2 norms x (input T d + one scale T)   / tp with sequence parallelism
        pair inputs        2 x T d (the normed input, whole)
        attention          4 x T (H/tp) hd + T (H/tp)            (q, K and V expanded to H/tp heads, out; lse)
        MLP                4 x T d_ff/tp                         (gate, silu(gate), up, their product)
    """
    tp = whole_number(tp, "tp")
    tokens = whole_number(batch, "batch") * whole_number(seq, "seq")
    d, hd, heads = model.d_model, model.head_dim, model.n_heads / tp
    outside = 2 * (tokens * d + tokens) / (tp if flag(sequence_parallel, "sequence_parallel") else 1)
    pair_inputs = 2 * tokens * d
    attention = 4 * tokens * heads * hd + tokens * heads
    mlp = 4 * tokens * model.d_ff / tp
    return (outside + pair_inputs + attention + mlp) * positive_number(bytes_per_value, "bytes_per_value")


def attention_bytes_per_rank(shape: AttentionShape, world_size: int = 1,
                             placement: str = "contiguous") -> dict[str, float]:
    """What one rank holds during one attention call on ``shape``, part by part. One rank (``world_size``
    1): q, k, v, the output and the whole score matrix, as a plain implementation materialises it. A
    ring rank: its rows of q and the output, its own K/V shard, the next one arriving (the ring's only
    extra), and the scores of one block, a chunk of queries against a chunk of keys."""
    n = whole_number(world_size, "world_size")
    chunk = check_sequence(shape.seq, n, placement) if n > 1 else shape.seq
    b, hd, B = shape.batch, shape.head_dim, shape.bytes_per_value
    rows = shape.seq / n
    parts = {"q and output rows": 2 * b * shape.heads * rows * hd * B, "own K/V": shape.kv_block_bytes(n)}
    if n > 1:
        parts["K/V arriving"] = shape.kv_block_bytes(n)
    parts["scores"] = b * shape.heads * (chunk if n > 1 else shape.seq) ** 2 * B
    return parts
