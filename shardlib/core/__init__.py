"""The reference: the mechanisms of every strategy, importing only the standard library, ``torch`` and itself.

Nothing here measures, times, prints or draws; a mechanism takes the group objects it needs (a ``TPGroup``, a
process group, ``ctx.comm``) and lets measurement attach through a ``probe``.

* ``adamw``: AdamW (Loshchilov and Hutter 2019), written out: the one optimizer every training run here uses.
* ``checkpoints``: A ``transformers`` model's weights and config read as the engine's, for each architecture it
  serves (Llama, Mixtral, DeepSeek-V3).
* ``checks``: The argument checks every config, formula and driver makes, with messages that show the value.
* ``collectives``: The ring all-reduce (Patarasuk and Yuan 2009), written out: a reduce-scatter, then an all-gather,
  over point-to-point sends.
* ``config``: ``ModelConfig``: one transformer's shape, the one model config of the package.
* ``model``: The transformer (Llama's, Touvron et al. 2023) as one process computes it: RMSNorm, rotary,
  grouped-query attention (or DeepSeek's multi-head latent attention), SwiGLU; the toy and the served model are
  two configs of it.
* ``mesh``: The one mesh: ``Layout(tp, pp, dp, ep, cp, dp_strategy)``, how it numbers ranks, the groups per
  axis.
* ``probe``: Where a mechanism lets measurement attach from outside, doing nothing by default.
* ``toy``: The toy every demo runs: ``model``'s blocks with no rotary, no norm weights, no embedding or head;
  its seeded weights.
* ``context_parallel``: Context parallelism: a long sequence split over ranks, attention still exact (ring,
  Ulysses, all-gather).
* ``data_parallel``: Data parallelism: flat buckets of gradients (DDP, ZeRO-1, ZeRO-2) and ZeRO-3's gathered
  units.
* ``experts``: Expert parallelism: the router, the dispatch and combine by all-to-all, the experts' placement.
* ``pipeline``: Pipeline parallelism: schedules as data, one registry of them, and the engine one stage runs.
* ``serving``: The serving engine: requests, the block manager, the scheduler, one loop, the paged model, the
  hand-off, the router.
* ``tensor_parallel``: Tensor parallelism: each layer's matrices cut column then row, one all-reduce per pair
  (Megatron-LM), sequence parallelism around the pairs, the vocabulary split.
* ``training``: The training step over every axis, composed from the strategies' mechanisms.
"""

__all__ = ["adamw", "checkpoints", "checks", "collectives", "config", "mesh", "model", "probe", "toy",
           "context_parallel", "data_parallel", "experts", "pipeline", "serving", "tensor_parallel", "training"]
