"""Tensor parallelism: each layer's matrices cut column then row, one all-reduce per pair (Megatron-LM), sequence
parallelism around the pairs, the vocabulary split.

* ``blocks``: The transformer's blocks split over a ``TPGroup`` (Megatron-LM, Shoeybi et al. 2019, section 3).
* ``layers``: Tensor parallelism on a rank: Megatron-LM's f and g, and the column- and row-parallel linear
  layers.
* ``sequence_parallel``: Megatron's sequence parallelism on a rank (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", section 4.2.2).
* ``vocab``: The two ends of a language model split over the vocabulary (Megatron-LM, Shoeybi et al. 2019,
  section 3).
"""

__all__ = ["blocks", "layers", "sequence_parallel", "vocab"]
