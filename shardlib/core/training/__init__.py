"""The training step over every axis, composed from the strategies' mechanisms.

* ``config``: ``TrainingConfig``: the toy language model and its training step, and the model's seeded
  weights.
* ``corpus``: ``MarkovCorpus``: what the toy language model learns from, the same tokens on every rank.
* ``moe_block``: The MLP of a toy block with experts, on a rank: the MoE layer (``core.experts.dispatch.moe_layer``,
  dropless) on this rank's sequence-parallel tokens.
* ``reference``: the toy language model trained in one process (``train_reference``): what the step must equal.
* ``step``: One training step on a rank over ``dp x pp x cp x tp`` (and ``ep``): the course's mechanisms,
  composed.
"""

__all__ = ["config", "corpus", "moe_block", "reference", "step"]
