"""The toy model on 4 ranks in every layout the planner allows, predicted against measured.

    .venv/bin/python benchmarks/bench_serving.py

Measures the link (a latency-bandwidth sweep on the 4 ranks) and this process's arithmetic speed,
plans the toy model (``models.TOY``, 4 blocks, d_model 64) on 4 CPU ranks seen as 2 "nodes" of 2 with a
500 kB memory cap, then runs every feasible layout for real: a forward of 4 sequences of 6 tokens, 20
times, in alternating rounds so every layout sees the same machine load. Prints, per layout, the
planner's predicted time, the measured median and the ratio, and checks the calls and bytes of every
run against the prediction (exact). No targets: absolute times move with the machine's load.
"""

from __future__ import annotations

import statistics
import time

import torch

from shardlib import Ranks
from shardlib.models import TOY
from shardlib.runtime.measure import TOLERANCE
from shardlib.serving import Workload, format_plan, plan_serving, run_combined, run_toy_cluster_calibration
from shardlib.toy import activations, stack_reference, stack_weights

ROUNDS, REPEATS = 4, 5


def main() -> None:
    layers, x = stack_weights(TOY), activations(4, 6, TOY.d_model)
    reference = stack_reference(x, layers, TOY)
    with Ranks(4) as four:
        start = time.perf_counter()
        fit = run_toy_cluster_calibration(four, TOY, layers)
        cluster, cal = fit.cluster, fit.calibration
        print(f"calibrated in {time.perf_counter() - start:.1f} s: "
              f"latency {cluster.intra_link.latency_s * 1e3:.2f} ms, "
              f"bandwidth {cluster.intra_link.bandwidth_bytes_per_s / 1e9:.2f} GB/s (R^2 {cal.overall.r_squared:.2f}), "
              f"arithmetic {cluster.peak_flops_per_s / 1e9:.1f} GFLOP/s")
        p = plan_serving(TOY, cluster, Workload(batch=4, context_tokens=6, prompt_tokens=6, microbatches=2), "latency")
        print(format_plan(p))
        times = {s.layout: [] for s in p.ranked}
        for s in p.ranked:  # warm-up: builds each mesh's process groups once
            run_combined(four, s.layout, TOY, layers, x, s.n_microbatches)
        for _ in range(ROUNDS):
            for s in p.ranked:
                for _ in range(REPEATS):
                    run = run_combined(four, s.layout, TOY, layers, x, s.n_microbatches)
                    assert run.measured == run.predicted, (run.measured, run.predicted)
                    assert torch.allclose(run.output, reference, atol=TOLERANCE, rtol=TOLERANCE)
                    times[s.layout].append(run.wall_s)
    print(f"\n{'layout':<16}{'predicted ms':>13}{'measured ms':>13}{'ratio':>8}   (median of {ROUNDS * REPEATS})")
    for s in p.ranked:
        measured = statistics.median(times[s.layout])
        print(f"{s.layout.label:<16}{s.prefill_s * 1e3:>13.2f}{measured * 1e3:>13.2f}{measured / s.prefill_s:>8.1f}")
    order_predicted = [s.layout.label for s in p.ranked]
    order_measured = [s.layout.label for s in sorted(p.ranked, key=lambda s: statistics.median(times[s.layout]))]
    print(f"\npredicted order: {order_predicted}\nmeasured order:  {order_measured}")


if __name__ == "__main__":
    main()
