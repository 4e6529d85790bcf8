"""Predictions, pure (no ``torch.distributed``): the alpha-beta model and its calibration, bubbles, memory, the
serving and training cost models and planners, replays of the engine's scheduler.

* ``alpha_beta``: The alpha-beta model: each collective's time from a link's latency and bandwidth, and the fit
  of both.
* ``bubbles``: The published bubbles (``BUBBLES``), in both notations, over one step's window; F, B and W from
  a run.
* ``context_parallel``: Context parallelism's formulas: bytes per rank of each method, the ring's time, memory
  per device.
* ``data_parallel``: What each strategy keeps on a GPU and sends per training step, from formulas. Pure: no
  torch.
* ``experts``: Expert parallelism's formulas: all-to-all bytes, the share of rows that leave home, weight
  bytes per rank, and what one all-to-all costs on a cluster with node-limited routing.
* ``pipeline``: What a pipeline predicts and what a real run measured: the bubble, who holds what, step time,
  memory.
* ``shapes``: What a model's shape says per device: which tensor-parallel degrees its heads and widths allow,
  KV heads and KV-cache bytes per device, a layer's and a stage's parameters per GPU (the memory model both
  planners share), uneven pipeline stages. Pure: no torch.
* ``tensor_parallel``: Tensor parallelism's formulas: each cut order's collectives, in buffer and wire bytes
  (Megatron-LM, Shoeybi et al. 2019, section 3). The shape rules are ``shapes``'. Pure.
* ``units``: How the planners write numbers: bytes in GB (or MB, kB), seconds in ms (or s). Pure: no torch.
* ``serving``: Serving predicted: one forward pass's cost, memory per GPU, the serving planner, the engine's
  scheduler replayed on a fitted step cost, pools, goodput.
* ``training``: Training predicted: memory per GPU, one step's time term by term, the training planner,
  published layouts beside it.
"""

__all__ = ["alpha_beta", "bubbles", "context_parallel",
           "data_parallel", "experts", "pipeline", "shapes", "tensor_parallel", "units", "serving",
           "training"]
