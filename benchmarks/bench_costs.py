"""The calibration sweep of notebook 02, timed as the live cell runs it, and what it fits, beside the presets.

    .venv/bin/python benchmarks/bench_costs.py

Starts ``Ranks(2)`` once (as the notebook does), then runs the default ``run_calibration`` several times and
prints each run's wall time against the 5 s target of a live cell, the fitted latency and bandwidth with
the fit's R squared, this machine set beside the interconnect presets, and the decode-vs-prefill table
of Llama-3-8B with this machine's row added. Everything is measured now, on this machine: the latency
and bandwidth move with its load.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

RUNS = 5
TARGET_S = 5.0


def main() -> int:
    from shardlib.facts.hardware import LINKS
    from shardlib.facts.models import LLAMA_3_8B
    from shardlib.lab.costs.calibration import run_calibration
    from shardlib.predict.alpha_beta import DEFAULT_CALLS, DEFAULT_ROUNDS, DEFAULT_SIZES_BYTES, crossover_bytes
    from shardlib.runtime.ranks import Ranks
    from shardlib.ui.tables import format_tp_cost_table

    print(f"calibration sweep: {len(DEFAULT_SIZES_BYTES)} sizes from {DEFAULT_SIZES_BYTES[0]} B to "
          f"{DEFAULT_SIZES_BYTES[-1] / 2 ** 20:.0f} MiB x all-reduce, all-to-all, point-to-point; "
          f"{DEFAULT_ROUNDS} rounds of {DEFAULT_CALLS} calls; {os.cpu_count()} cores, pid {os.getpid()}\n")
    started = time.perf_counter()
    with Ranks(2) as ranks:
        print(f"Ranks(2) started in {time.perf_counter() - started:.2f} s (not part of the sweep)\n")
        runs = []
        for i in range(RUNS):
            cal = run_calibration(ranks)
            runs.append(cal)
            fit = cal.overall
            per_op = ", ".join(f"{op} {f.r_squared:.2f}" for op, f in cal.per_op.items())
            print(f"  run {i + 1}: {cal.wall_s:5.2f} s   latency {fit.latency_s * 1e6:6.1f} us   bandwidth "
                  f"{fit.bandwidth_bytes_per_s / 1e9:5.2f} GB/s   R^2 {fit.r_squared:.3f}  (per op: {per_op})")

    walls = [c.wall_s for c in runs]
    median_wall, worst_wall = statistics.median(walls), max(walls)
    ok = worst_wall <= TARGET_S
    print(f"\n  wall time of one sweep (the live cell): median {median_wall:.2f} s, worst {worst_wall:.2f} s   "
          f"target <= {TARGET_S:.0f} s   {'ok' if ok else 'FALLS SHORT'}")

    typical = sorted(runs, key=lambda c: c.overall.latency_s)[len(runs) // 2]  # the median run by latency
    here = typical.link
    print("\nthis machine (the run with the median latency) beside the presets:")
    print(f"  {'link':<30} {'latency':>10} {'each way':>12} {'p2p crossover':>15}")
    for link in [*LINKS.values(), here]:
        print(f"  {link.name:<30} {link.latency_s * 1e6:>7.1f} us {link.one_way_bytes_per_s / 1e9:>7.2f} GB/s "
              f"{crossover_bytes(link) / 1e3:>12,.0f} KB")
    print(f"  fit: R^2 {typical.overall.r_squared:.3f} over {typical.overall.n_samples} timings, median relative "
          f"error {typical.overall.median_relative_error:.0%}")

    print("\ndecode vs prefill, tensor-parallel communication (one latency per collective):\n")
    print(format_tp_cost_table(LLAMA_3_8B, [*LINKS.values(), here]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
