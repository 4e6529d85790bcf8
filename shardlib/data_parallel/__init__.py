"""Data parallelism: every rank trains on its share of the batch; DDP, and ZeRO's three stages.

* ``flat`` (pure): parameters laid end to end in flat groups (gradient buckets, ZeRO-3 units), padded
  so every rank owns an equal shard.
* ``predict`` (pure): memory per rank and bytes per step for each strategy, ZeRO's ``(2 + 2 + 12)``
  table for real models, activations per layer, a training GPU's whole budget.
* ``reference``: one process training on the whole batch with AdamW; the toy model; the input checks.
* ``activations``: activations per layer measured on the toy, with and without recomputation.
* ``buckets`` (rank): DDP, ZeRO-1 and ZeRO-2: flat buckets, gradient hooks, overlapped collectives.
* ``zero3`` (rank): ZeRO-3 / FSDP: each layer gathered before its forward and backward, freed after,
  the next one prefetched.
* ``ranks`` (rank): the training loop on a rank; all-reduce against reduce-scatter + all-gather.
* ``peer`` (rank): PyTorch's ``DistributedDataParallel`` and ``fully_shard`` on the same ranks.
* ``drivers``: ``train_data_parallel`` and the ``DataParallelRun`` it returns.
* ``experiments``: strategies side by side, overlap on and off, the collective identity, the peers.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "flat": ("STRATEGIES", "STRATEGY_TITLES", "FlatGroup", "plan_buckets", "plan_units", "padded", "total_numel"),
    "predict": ("STATE_BYTES_MIXED", "STATE_BYTES_FP32", "memory_per_rank", "step_wire_bytes", "zero_table",
                "layout_memory", "layout_step_ops", "layout_step_bytes", "gathered_peak_bytes",
                "layer_activation_bytes", "training_memory_per_gpu", "check_strategy"),
    "reference": ("ResidualMLP", "toy_model", "toy_batches", "local_rows", "global_mse",
                  "parameter_units", "check_training_inputs", "ReferenceRun", "train_reference", "largest_gap"),
    "activations": ("Checkpointed", "ActivationMeasurement", "measure_activations", "mlp_activation_bytes"),
    "buckets": ("BucketedReplica",),
    "zero3": ("ShardedUnits",),
    "ranks": ("train_on_rank", "collectives_on_rank"),
    "peer": ("PEERS", "torch_ddp_on_rank", "torch_fsdp2_on_rank"),
    "drivers": ("TOLERANCE", "DataParallelRun", "train_data_parallel", "within_tolerance"),
    "experiments": ("run_strategies", "OverlapComparison", "run_overlap", "CollectiveIdentity",
                    "run_collective_identity", "PeerComparison", "run_peer"),
})
