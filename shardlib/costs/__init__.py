"""What communication costs: the alpha-beta model, whole forward passes priced, and measurements.

* ``alpha_beta`` (pure): each collective's time from a link's latency and bandwidth (ring formulas),
  nccl-tests' algorithm and bus bandwidth, the crossover between latency- and bandwidth-bound.
* ``predict`` (pure): replicas against tensor parallelism, from a step's compute and communication (the
  prediction of the live demo; the serving planner's replicas-against-tp pairs build on it).
* ``calibration`` (pure): the least-squares fit of a latency and a bandwidth to measured times.
* ``emulation`` (pure): ``EmulatedLink``, a slow link between "nodes" of one machine, priced by alpha-beta.
* ``ranks``: rank functions: the sweep (whole pool or its first ranks), a slow rank, serving both ways.
* ``drivers``: ``run_calibration``, ``run_decode_vs_prefill``, ``run_slow_rank``, ``run_replicas_vs_tp``,
  each sweep's rounds spread over time, every size in turn, and ``measure_until`` (a measurement
  retried on a busy machine, saying how many attempts it took); ``run_*_check``, the same measurements
  with their ``verdicts`` (``runtime.verdict``: predicted, measured, ratio, verdict), as notebook 02
  prints them.

The links themselves are facts, in ``shardlib.hardware``. A whole forward pass priced (decode against
prefill, the crossover batch, pipeline against tensor) is ``shardlib.serving.cost``.
"""

from .._lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "alpha_beta": ("COLLECTIVE_OPS", "cost_terms", "collective_terms_s", "collective_time_s", "all_reduce_s",
                   "all_to_all_s", "point_to_point_s", "algorithm_bandwidth",
                   "bus_bandwidth", "crossover_bytes"),
    "predict": ("ReplicasVsTensorParallel", "replicas_vs_tensor_parallel"),
    "emulation": ("EmulatedLink",),
    "calibration": ("Sample", "LinkFit", "Calibration", "fit_link", "r_squared", "fastest_of_slowest",
                    "median_of_slowest", "SWEEP_OPS", "DEFAULT_SIZES_BYTES"),
    "ranks": ("sweep_on_rank", "one_call", "leading_group", "slow_rank_on_rank", "serve_both_ways_on_rank",
              "ServedBothWays", "SlowRankTimes", "SLOW_RANK_OPS", "MAX_DELAY_S"),
    "drivers": ("run_calibration", "measure_until", "DecodeVsPrefillRun", "run_decode_vs_prefill",
                "SlowRankRun",
                "run_slow_rank", "ReplicasVsTPRun", "run_replicas_vs_tp", "serving_model",
                "CalibrationCheck", "run_calibration_check", "calibration_verdicts",
                "DecodeVsPrefillCheck", "run_decode_vs_prefill_check", "decode_vs_prefill_verdicts",
                "SlowRankCheck", "run_slow_rank_check", "slow_rank_verdicts",
                "ReplicasVsTPCheck", "run_replicas_vs_tp_check", "replicas_vs_tp_verdicts"),
})
