"""The rank runtime, measured side by side in one run on 2 ranks.

    make bench        (or: .venv/bin/python benchmarks/bench_runtime.py)

Prints each figure with its target and the measured ratio. Everything runs on this machine, now, in
this one process: the ratios are the point, absolute times move with the machine's load.
"""

from __future__ import annotations

import os
import statistics
import subprocess
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


def first_pool_s(method: str) -> float:
    """Seconds from a fresh Python's ``import shardlib`` to a pool of ``WORLD`` ranks answering a call."""
    code = ("import time; t = time.perf_counter(); from shardlib import Ranks; "
            f"r = Ranks({WORLD}, start={method!r}); r.run(lambda ctx: None); print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def pss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))


def row(label: str, value: str, target: str, ok: bool) -> None:
    print(f"  {label:<58} {value:>22}   target {target:<22} {'ok' if ok else 'FALLS SHORT'}")


def main() -> int:
    from _launchers import start_join_allreduce_exit, start_until_ready

    from shardlib.runtime.ranks import Ranks

    print(f"rank runtime benchmark: {WORLD} ranks, gloo on CPU, {os.cpu_count()} cores, pid {os.getpid()}\n")

    # 1. the first pool of a fresh process (a kernel's first Ranks), alternating to share the machine's mood
    first = {"template": [], "spawn": []}
    plain = []
    for _ in range(3):
        t = time.perf_counter()
        finish = start_until_ready(WORLD)
        plain.append(time.perf_counter() - t)
        finish()
        for method in first:
            first[method].append(first_pool_s(method))
    print("first pool of a fresh process (import shardlib, start the ranks, join the group, answer a call; "
          "median of 3)")
    for method, times in first.items():
        row(f"Ranks(2, start={method!r})", f"{statistics.median(times):.2f} s", "", True)
    row("plain mp.spawn + init_process_group (no shardlib import, no call)", f"{statistics.median(plain):.2f} s", "",
        True)
    first_ratio = statistics.median(first["template"]) / statistics.median(first["spawn"])
    row("template / spawn (today's way)", f"{first_ratio:.2f}x", "<= 1.10x", first_ratio <= 1.10)

    # 1b. a later pool in the same process: Ranks(4) while a Ranks(2) is warm
    later = {"template": [], "spawn": []}
    memory = {}
    with Ranks(WORLD, start="template"), Ranks(WORLD, start="spawn"):
        for _ in range(5):
            for method in later:
                t = time.perf_counter()
                four = Ranks(4, start=method)
                four.run(noop)
                later[method].append(time.perf_counter() - t)
                helpers = [p for p in four.parent_pids if p != os.getpid()]  # the template, when there is one
                memory[method] = sum(pss_bytes(p) for p in set(four.pids + helpers))
                four.close()
    print("\na later pool in the same process: Ranks(4) beside a warm Ranks(2), started and answering (median of 5)")
    for method, times in later.items():
        row(f"Ranks(4, start={method!r})", f"{statistics.median(times) * 1e3:.0f} ms",
            "<= 500 ms" if method == "template" else "", method != "template" or statistics.median(times) <= 0.5)
    speedup = statistics.median(later["spawn"]) / statistics.median(later["template"])
    row("spawn / template", f"{speedup:.0f}x", "", True)
    print("\nmemory of the 4 rank processes, and of the template they were forked from (proportional set size: "
          "shared pages split between sharers)")
    for method, size in memory.items():
        row(f"Ranks(4, start={method!r})", f"{size / 2**20:.0f} MiB", "", True)
    row("template / spawn", f"{memory['template'] / memory['spawn']:.2f}x", "< 1x",
        memory["template"] < memory["spawn"])

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
