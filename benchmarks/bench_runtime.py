"""The rank runtime, measured side by side in one run on 2 ranks.

    make bench        (or: .venv/bin/python benchmarks/bench_runtime.py)

Prints each figure with its target and the measured ratio. Everything runs on this machine, now, in
this one process: the ratios are the point, absolute times move with the machine's load.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORLD = 2


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def noop(ctx):
    return None


def small_all_reduce(ctx, n_elements=1024):
    """The live cell being re-run: one all-reduce of 4 KiB."""
    import torch

    return ctx.comm.all_reduce(torch.ones(n_elements)).sum().item()


def wrapped_vs_raw(ctx, n_elements: int, repeats: int) -> tuple[float, float]:
    """Median seconds of ``ctx.comm.all_reduce`` and of raw ``dist.all_reduce``, interleaved."""
    import torch
    import torch.distributed as dist

    x = torch.ones(n_elements)
    raw, wrapped = [], []
    ctx.comm.barrier()
    for i in range(repeats):
        for kind in (("raw", "wrapped") if i % 2 else ("wrapped", "raw")):
            dist.barrier()
            t = time.perf_counter()
            if kind == "raw":
                dist.all_reduce(x)
            else:
                ctx.comm.all_reduce(x)
            (raw if kind == "raw" else wrapped).append(time.perf_counter() - t)
    return statistics.median(wrapped), statistics.median(raw)


def row(label: str, value: str, target: str, ok: bool) -> None:
    print(f"  {label:<58} {value:>22}   target {target:<22} {'ok' if ok else 'FALLS SHORT'}")


def main() -> int:
    from _launchers import start_join_allreduce_exit, start_until_ready

    from shardlib import Ranks

    print(f"rank runtime benchmark: {WORLD} ranks, gloo on CPU, {os.cpu_count()} cores, pid {os.getpid()}\n")

    # 1. cold start, alternating to share the machine's mood
    ours, plain = [], []
    for _ in range(3):
        t = time.perf_counter()
        finish = start_until_ready(WORLD)
        plain.append(time.perf_counter() - t)
        finish()
        t = time.perf_counter()
        ranks = Ranks(WORLD)
        ours.append(time.perf_counter() - t)
        ranks.close()
    cold_ratio = statistics.median(ours) / statistics.median(plain)
    print("cold start (start processes, import torch, join the group; median of 3)")
    row("Ranks(2)", f"{statistics.median(ours):.2f} s", "", True)
    row("plain mp.spawn + init_process_group", f"{statistics.median(plain):.2f} s", "", True)
    row("Ranks / plain spawn", f"{cold_ratio:.2f}x", "<= 1.10x", cold_ratio <= 1.10)

    with Ranks(WORLD) as ranks:
        # 2. round trip of a no-op
        for _ in range(200):
            ranks.run(noop)
        rt_s = median_s(lambda: ranks.run(noop), 3000)
        rt_lambda_s = median_s(lambda: ranks.run(lambda ctx: None), 1000)
        print("\nround trip of run() for a no-op (median)")
        row("importable function (pickled by reference)", f"{rt_s * 1e3:.3f} ms", "<= 0.300 ms", rt_s <= 0.3e-3)
        row("lambda defined here (pickled by value)", f"{rt_lambda_s * 1e3:.3f} ms", "(no target)", True)

        # 3. recorded collectives against raw torch.distributed, in the same workers
        print("\nall-reduce through ctx.comm vs raw torch.distributed (same workers, interleaved)")
        comm_ok = True
        for label, n_elements, repeats in (("4 KiB", 1024, 2000), ("64 MiB", 16 * 2**20, 16)):
            per_rank = ranks.run(wrapped_vs_raw, n_elements, repeats)
            wrapped_s = max(w for w, _ in per_rank)
            raw_s = max(r for _, r in per_rank)
            throughput = raw_s / wrapped_s
            comm_ok &= throughput >= 0.97
            row(f"{label}: ctx.comm {wrapped_s * 1e3:.3f} ms, raw {raw_s * 1e3:.3f} ms",
                f"{throughput:.3f}x raw", ">= 0.97x raw", throughput >= 0.97)

        # 4. re-running a live cell
        for _ in range(20):
            ranks.run(small_all_reduce)
        warm_s = median_s(lambda: ranks.run(small_all_reduce), 300)
    fork_s = median_s(lambda: start_join_allreduce_exit("fork", WORLD), 5)
    spawn_s = median_s(lambda: start_join_allreduce_exit("spawn", WORLD), 3)
    print("\nre-running a live cell (one 4 KiB all-reduce; per-call launchers start and stop ranks each time)")
    row("warm Ranks pool", f"{warm_s * 1e3:.3f} ms", "", True)
    row("fork per call (unsafe in a threaded kernel, with CUDA)", f"{fork_s * 1e3:.1f} ms", "", True)
    row("spawn per call (torch's mp.spawn way)", f"{spawn_s * 1e3:.1f} ms", "", True)
    row("spawn per call / warm", f"{spawn_s / warm_s:.0f}x", ">= 20x", spawn_s / warm_s >= 20)
    row("fork per call / warm", f"{fork_s / warm_s:.0f}x", "> 1x", fork_s / warm_s > 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
