"""Predictions, pure (no ``torch.distributed``): the alpha-beta model and its calibration, bubbles, memory, the
serving and training cost models and planners, replays of the engine's scheduler.

* ``all_to_all``: What one expert-parallel all-to-all costs on a cluster, with node-limited routing
  (DeepSeek-V3's).
* ``alpha_beta``: The alpha-beta model: each collective's time from a link's latency and bandwidth.
* ``bubbles``: The published bubbles (the registry's), in both notations, over one step's window; F, B and W
  from a run.
* ``calibration``: Calibrate the alpha-beta model: a latency and a bandwidth fitted to measured times by least
  squares.
* ``context_parallel``: Context parallelism's formulas: bytes per rank of each method, forward and backward,
  and the ring's time.
* ``context_parallel_memory``: Memory per device against sequence length: weights and KV cache under ``tp x
  cp``, one ring rank's holdings, and the toy block's saved activations under sequence parallelism.
* ``costs``: Replicas against tensor parallelism: the throughput of ``world_size`` independent copies against
  one tensor-parallel copy, from a step's compute and its communication.
* ``data_parallel``: What each strategy keeps on a GPU and sends per training step, from formulas. Pure: no
  torch.
* ``experts``: Expert parallelism's formulas: all-to-all bytes, the share of rows that leave home, weight
  bytes per rank.
* ``pipeline``: What a pipeline predicts and what a real run measured: the bubble, who holds what, step time,
  memory.
* ``shapes``: What a model's shape alone says, before any device is chosen: which tensor-parallel degrees its
  heads and widths allow and what passing a wall costs (KV heads copied, the vocabulary padded), KV heads per
  device and KV-cache bytes, uneven pipeline stages. Pure: no torch.
* ``tensor_parallel``: Tensor parallelism's formulas: each cut order's collectives, in buffer and wire bytes;
  the shape rules (the vocabulary split's too) and the largest degree a model's shapes allow (Megatron-LM,
  Shoeybi et al. 2019, section 3). Pure.
* ``units``: How the planners write numbers: bytes in GB (or MB, kB), seconds in ms. Pure: no torch.
* ``serving``: Serving predicted: one forward pass's cost, memory per GPU, the serving planner, the engine's
  scheduler replayed on a fitted step cost, pools, goodput.
* ``training``: Training predicted: memory per GPU, one step's time term by term, the training planner,
  published layouts beside it.
"""

__all__ = ["all_to_all", "alpha_beta", "bubbles", "calibration", "context_parallel", "context_parallel_memory",
           "costs", "data_parallel", "experts", "pipeline", "shapes", "tensor_parallel", "units", "serving",
           "training"]
