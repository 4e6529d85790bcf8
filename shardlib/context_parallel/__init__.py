"""Context parallelism: long sequences split across ranks, attention still exact, forward and backward.

* ``placement`` (pure): which tokens each rank holds, contiguous or zigzag, and the causal blocks each computes.
* ``online_softmax`` (pure): attention one block of keys at a time, partials and their merge; one block's gradients.
* ``reference`` (pure): whole-sequence attention and its gradients, the q/k/v checks, shards cut and joined,
  the ring in one process, the tiny attention layer trained in notebook 10.
* ``predict`` (pure): bytes per rank of each method; the ring's time and the tokens that hide its transfer.
* ``memory`` (pure): KV cache and activations per device against sequence length, under tp and cp.
* ``ring`` (mechanism): ``ring_attention``, K/V round the ring forward, K/V with dK/dV round it backward.
* ``all_gather`` (mechanism): ``all_gather_kv_attention``, K/V all-gathered, then my queries attend (Llama 3).
* ``ulysses`` (mechanism): ``ulysses_attention``, all-to-all from sequence to heads and back, differentiable.
* ``ranks``: the rank functions, the mechanisms with spans, padding and comm logs attached through a probe.
* ``drivers``: the forward on a pool: ring, balance, overlap, link calibration, all-to-all.
* ``grad_drivers``: the backward on a pool: every rank's gradients against autograd, training through the ring.

Megatron's sequence parallelism, an extension of tensor parallelism, lives in ``shardlib.tensor_parallel``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "placement": ("PLACEMENTS", "check_sequence", "chunks_of_rank", "positions_of_rank", "block_kind",
                  "blocks_between", "RankWork", "causal_work", "imbalance"),
    "online_softmax": ("Partial", "block_partial", "merge", "attend_block", "block_grads", "attend_block_backward"),
    "reference": ("attention_reference", "attention_grads_reference", "check_qkv", "shard_sequence",
                  "gather_sequence", "ring_pass", "simulate_ring_attention", "attention_layer_weights",
                  "attention_layer", "train_attention_layer_reference"),
    "predict": ("METHODS", "AttentionShape", "ring_bytes_per_rank", "ring_backward_bytes_per_rank",
                "ring_saved_bytes_per_rank", "ulysses_bytes_per_rank", "ulysses_collectives",
                "sequence_parallel_bytes_per_rank", "ring_time_s", "ring_transfer_s", "hidden_share",
                "ring_block_attention_s", "ring_hiding_tokens", "all_gather_kv_collectives",
                "all_gather_kv_bytes_per_rank", "all_gather_kv_held_bytes", "CP_COMM_TYPES", "cp_comm_bytes_per_rank"),
    "memory": ("device_memory", "context_parallel_needed", "toy_block_activation_bytes",
               "attention_bytes_per_rank"),
    "ring": ("ring_attention", "RingAttention", "check_ring_inputs"),
    "all_gather": ("all_gather_kv_attention", "check_all_gather_inputs", "GatherKV"),
    "ulysses": ("ulysses_attention", "check_heads_divide", "sequence_to_heads", "heads_to_sequence"),
    "ranks": ("RingProbe", "ring_attention_on_rank", "ring_attention_grads_on_rank", "ring_training_on_rank",
              "ulysses_attention_on_rank", "all_gather_attention_on_rank", "exchange_sweep_on_rank", "RingResult",
              "AttentionGradsResult", "RingTrainingResult", "UlyssesResult"),
    "drivers": ("RingRun", "run_ring_attention", "Balance", "run_ring_balance", "Overlap", "run_ring_overlap",
                "ExchangeCalibration", "run_exchange_calibration", "UlyssesRun", "run_ulysses_attention",
                "run_all_gather_attention", "BalanceCheck", "balance_verdicts", "run_balance_check", "OverlapCheck",
                "overlap_verdicts", "run_overlap_check"),
    "grad_drivers": ("AttentionGrads", "run_ring_attention_grads", "run_ulysses_attention_grads", "RingTraining",
                     "run_ring_training"),
})
