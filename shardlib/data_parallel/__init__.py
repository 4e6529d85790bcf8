"""Data parallelism: every rank trains on its share of the batch; DDP, and ZeRO's three stages.

* ``buckets`` (mechanism, rank): DDP, ZeRO-1 and ZeRO-2: flat buckets, gradient hooks, all-reduce or
  reduce-scatter launched during the backward, the step on the shard, all-gather.
* ``zero3`` (mechanism, rank): ZeRO-3 / FSDP: gather a unit before its forward and its backward, free
  it after, prefetch the next.
* ``flat`` (pure): parameters laid end to end in flat groups (buckets, ZeRO-3 units), padded evenly.
* ``reference`` (pure): one process training on the whole batch; the toy model; the input checks.
* ``predict`` (pure): memory per rank and bytes per step for each strategy, ZeRO's table, activations.
* ``activations`` (pure, one process): activations per layer measured, with and without recomputation.
* ``ranks`` (rank): ``train_on_rank``, the mechanisms with their buffers metered; the collectives check.
* ``peer`` (rank): PyTorch's ``DistributedDataParallel`` and ``fully_shard`` on the same ranks.
* ``drivers``: ``run_data_parallel`` and its ``DataParallelRun``; every strategy, overlap, the
  collective identity and the peers, each on a pool.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "flat": ("STRATEGIES", "STRATEGY_TITLES", "FlatGroup", "plan_buckets", "plan_units", "padded"),
    "predict": ("STATE_BYTES_MIXED", "STATE_BYTES_FP32", "STATE_BYTES_MEGATRON", "memory_per_rank", "step_wire_bytes",
                "zero_table",
                "layout_memory", "layout_step_ops", "layout_step_bytes", "gathered_peak_bytes",
                "layer_activation_bytes", "training_memory_per_gpu", "mlp_activation_bytes", "check_strategy"),
    "reference": ("AdamW", "ResidualMLP", "toy_model", "toy_batches", "local_rows", "global_mse",
                  "parameter_units", "check_training_inputs", "ReferenceRun", "train_reference", "largest_gap"),
    "activations": ("Checkpointed", "ActivationMeasurement", "measure_activations"),
    "buckets": ("BucketedReplica",),
    "zero3": ("ShardedUnits",),
    "ranks": ("BufferProbe", "train_on_rank", "TrainResult", "collectives_on_rank", "CollectivesResult"),
    "peer": ("PEERS", "torch_ddp_on_rank", "torch_fsdp2_on_rank"),
    "drivers": ("TOLERANCE", "DataParallelRun", "run_data_parallel", "StrategyRuns",
                "run_strategies", "OverlapComparison", "run_overlap", "CollectiveIdentity",
                "run_collective_identity", "PeerComparison", "run_peer", "IdentityCheck", "run_identity_check",
                "OverlapCheck", "run_overlap_check"),
})
