"""Sequence and context parallelism: long sequences split across ranks, attention still exact.

* ``layouts`` (pure): which tokens each rank holds, contiguous or zigzag (load-balanced), and the
  attention blocks each rank computes under a causal mask.
* ``online_softmax`` (pure): attention one block of keys at a time, partial results and their merge.
* ``reference`` (pure): the whole-sequence attention, the input checks, cutting tensors into shards,
  the ring played in one process.
* ``predict`` (pure): bytes per rank of each method, the ring's time by alpha-beta, the share hidden.
* ``memory`` (pure): KV cache and activations per device against sequence length, under tp and cp.
* ``ring`` (on a rank): ``ring_attention``, K/V passed round the ring with send/recv, overlapped.
* ``ulysses`` (on a rank): ``ulysses_attention``, all-to-all from sequence to heads and back.
* ``drivers``: run them on a pool, against the references and the predictions.

Megatron's sequence parallelism, an extension of tensor parallelism, lives in ``shardlib.tensor_parallel``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "layouts": ("LAYOUTS", "check_sequence", "chunks_of_rank", "positions_of_rank", "block_kind", "RankWork",
                "causal_work", "imbalance"),
    "online_softmax": ("Partial", "block_partial", "merge", "attend_block"),
    "reference": ("attention_reference", "check_qkv", "shard_sequence", "gather_sequence", "ring_pass",
                  "simulate_ring_attention"),
    "predict": ("METHODS", "AttentionShape", "ring_bytes_per_rank", "ulysses_bytes_per_rank", "ulysses_collectives",
                "sequence_parallel_bytes_per_rank", "method_bytes", "ring_time_s", "ring_transfer_s", "hidden_share"),
    "memory": ("attention_activation_bytes",
               "device_memory", "context_parallel_needed", "toy_block_activation_bytes", "attention_bytes_per_rank"),
    "ring": ("ring_attention", "ring_attention_on_rank", "check_ring_inputs", "exchange_sweep_on_rank"),
    "ulysses": ("ulysses_attention", "ulysses_attention_on_rank", "check_heads_divide", "sequence_to_heads",
                "heads_to_sequence"),
    "drivers": ("RingRun", "run_ring_attention", "Balance", "run_ring_balance", "Overlap", "run_ring_overlap",
                "calibrate_exchange", "UlyssesRun", "run_ulysses_attention", "TOLERANCE"),
})
