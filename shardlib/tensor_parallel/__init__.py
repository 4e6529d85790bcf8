"""Tensor parallelism: cut each layer's matrices, column then row, one all-reduce per pair; and
Megatron's sequence parallelism around the pairs.

* ``layers``: ``TPGroup``, Megatron-LM's f and g, the column- and row-parallel linear layers.
* ``blocks``: the toy's MLP, attention and whole block split over a ``TPGroup``.
* ``sequence_parallel``: all-gather before each pair, reduce-scatter after (Korthikanti et al. 2022).
* ``vocab``: the embedding and the cross-entropy split over the vocabulary; the logits never gathered.
* ``reference``: ``ROW_PARALLEL`` (the weights cut by rows), ``shard_columns``, ``shard_rows``,
  ``TensorParallelPair``, ``simulate_tp_stack``, ``simulate_vocab_parallel_cross_entropy`` (one process).
* ``predict``: each cut's collectives in buffer and wire bytes, ``other_cut_ratios``, the shape rules
  (the vocabulary split's too).
* ``ranks``: rank functions (``tp_mlp_on_rank``, the two cut orders, ``sp_block_on_rank``).
* ``drivers``: ``run_tp_block``, ``run_pair``, ``run_sequence_parallel``: on a pool, against the reference.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "reference": ("ROW_PARALLEL", "shard_columns", "shard_rows", "TensorParallelPair", "simulate_tp_stack",
                  "vocab_range", "check_targets", "simulate_vocab_parallel_cross_entropy"),
    "predict": ("CUTS", "pair_collectives", "pair_wire_collectives", "other_cut_ratios",
                "max_tensor_parallel_shards", "check_sequence_parallel", "check_vocab_split"),
    "layers": ("TPGroup", "CopyToParallelRegion", "ReduceFromParallelRegion", "ColumnParallelLinear",
               "RowParallelLinear"),
    "blocks": ("ParallelMLP", "ParallelAttention", "ParallelBlock"),
    "sequence_parallel": ("GatherFromSequence", "ScatterToSequence", "SequenceParallelBlock"),
    "vocab": ("VocabParallelEmbedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy"),
    "ranks": ("tp_mlp_on_rank", "tp_attention_on_rank", "pair_column_then_row_on_rank",
              "pair_row_then_column_on_rank", "sp_block_on_rank", "TPBlockResult", "PairResult", "SPBlockResult"),
    "drivers": ("TPBlockRun", "run_tp_block", "PairRun", "run_pair", "BLOCKS", "BlockMode", "SequenceParallelRun",
                "run_sequence_parallel"),
})
