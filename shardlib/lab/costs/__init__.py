"""Communication costs measured on ranks, each beside its alpha-beta prediction.

* ``calibration``: This machine's latency and bandwidth: a sweep of message sizes timed on ranks, and the
  alpha-beta fit.
* ``decode_vs_prefill``: Decode against prefill, measured: all-reduces of one token's activations and of
  thousands, at tp = 2 and 4.
* ``emulation``: A slower link between "nodes" of one machine, emulated: the toy cluster's network, made
  measurable.
* ``replicas``: Replicas against one tensor-parallel copy, served on ranks, a decode step of each way in turn.
* ``slow_rank``: One slow rank: it sleeps (a throttled device, say), then every rank calls the same collective.
"""

__all__ = ["calibration", "decode_vs_prefill", "emulation", "replicas", "slow_rank"]
