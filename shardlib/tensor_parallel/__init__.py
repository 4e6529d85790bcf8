"""Tensor parallelism: cut each layer's matrices, column then row, one all-reduce per pair.

* ``split`` (pure, one process): ``shard_columns``, ``shard_rows``, ``TensorParallelPair``, the
  collectives of each cut order (``pair_collectives``; on the wire, ``pair_wire_collectives``; their
  ratios, ``other_cut_ratios``), ``max_tensor_parallel_shards``.
* ``layers`` (on a rank): ``TPGroup`` (the ranks a layer is split over), Megatron-LM's f and g, the
  column- and row-parallel linear layers.
* ``blocks`` (on a rank): the toy transformer's MLP, attention and whole block split over a ``TPGroup``,
  and ``simulate_tp_stack``, the same blocks summed in one process.
* ``ranks``: rank functions (``tp_mlp_on_rank`` ...). ``drivers``: ``run_tp_block`` and ``run_pair``,
  which run them on a pool and compare with the unsharded computation.
* ``sequence_parallel`` (on a rank): Megatron's sequence parallelism around the tensor-parallel pairs;
  ``sp_drivers``: ``run_sequence_parallel``, against tensor parallelism and the unsharded block.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "split": ("shard_columns", "shard_rows", "TensorParallelPair", "CUTS", "pair_collectives",
              "pair_wire_collectives", "other_cut_ratios", "max_tensor_parallel_shards"),
    "layers": ("TPGroup", "CopyToParallelRegion", "ReduceFromParallelRegion", "ColumnParallelLinear",
               "RowParallelLinear"),
    "blocks": ("ParallelMLP", "ParallelAttention", "ParallelBlock", "simulate_tp_stack"),
    "ranks": ("tp_mlp_on_rank", "tp_attention_on_rank", "pair_column_then_row_on_rank",
              "pair_row_then_column_on_rank"),
    "drivers": ("TPBlockRun", "run_tp_block", "PairRun", "run_pair", "BLOCKS"),
    "sequence_parallel": ("GatherFromSequence", "ScatterToSequence", "SequenceParallelBlock", "sp_block_on_rank",
                          "check_sequence_parallel"),
    "sp_drivers": ("BlockMode", "SequenceParallelRun", "run_sequence_parallel"),
})
