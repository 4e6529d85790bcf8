"""A tensor-parallel gated MLP on 2 ranks against the same MLP unsharded in one process, in one run.

    .venv/bin/python benchmarks/bench_tensor_parallel.py

One layer of a Llama-sized MLP (d_model 2048, d_ff 5632, 16 tokens, float32). The single-process
baseline is ``mlp_reference`` run on a ``Ranks(1)`` pool, so it gets the same process setup as the
ranks; the sharded version runs on ``Ranks(2)``: gate and up split by columns, down by rows, one
all-reduce of the output per forward. Every process computes with one thread. The two are measured in
alternating rounds so both see the same machine load. Prints the times, the speedup, the efficiency
per device and the share of the sharded forward spent in the all-reduce; there are no targets here,
absolute times move with the machine's load. ``lab.harness.on_ranks`` repeats each forward after a
barrier and reads its time and its all-reduce's from the ranks' clocks and comm logs.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

WORLD = 2
BATCH, SEQ, D_MODEL, D_FF = 1, 16, 2048, 5632
SEED = 0
WARMUP = 3
REPEATS = 10  # timed forwards per round
ROUNDS = 3  # rounds alternate single process and 2 ranks
ATOL = 1e-4


def make_weights(seed: int):
    """Gate, up and down weights in the ``(out, in)`` layout, scaled by 1/sqrt(fan_in).

    Built inside each rank from the seed rather than shipped: every process gets the same numbers
    (the output check below would fail otherwise) without pickling ~140 MB per rank.
    """
    from shardlib.core.toy import generator, mlp_weights

    w = mlp_weights(generator(seed), D_MODEL, D_FF)
    return w["gate"], w["up"], w["down"]


_BUILT: dict = {}  # on a rank, within one call: what ``built`` made, kept across the repeats


def built(key: str, make):
    """``make()`` once per rank per call (the first repeat, a warm-up), then kept."""
    if key not in _BUILT:
        _BUILT[key] = make()
    return _BUILT[key]


def single_forward(ctx, x, seed: int):
    """The unsharded MLP on one rank with one thread: one forward, its output."""
    import torch

    from shardlib.core.model import mlp_reference

    torch.set_num_threads(1)
    weights = built("single", lambda: make_weights(seed))
    with torch.no_grad():
        return mlp_reference(x, *weights)  # (batch, seq, d_model)


def tp_forward(ctx, x, seed: int):
    """The sharded MLP on this rank with one thread: one forward, its output. The shards are cut in the
    first repeat: gate and up column-parallel (d_ff / tp, d_model) each, down row-parallel (d_model, d_ff / tp)."""
    import torch

    from shardlib.core.tensor_parallel.blocks import ParallelMLP
    from shardlib.core.tensor_parallel.layers import TPGroup

    torch.set_num_threads(1)
    mlp = built("tp", lambda: ParallelMLP(dict(zip(("gate", "up", "down"), make_weights(seed))), TPGroup.world(ctx)))
    with torch.no_grad():
        return mlp(x)  # (batch, seq, d_model), whole on every rank


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<52} {value:>14}   {note}")


def main() -> int:
    import torch

    from shardlib.lab.harness import on_ranks
    from shardlib.runtime.ranks import Ranks

    assert D_FF % WORLD == 0, f"d_ff {D_FF} must split evenly over {WORLD} ranks"
    torch.manual_seed(SEED + 1)
    x = torch.randn(BATCH, SEQ, D_MODEL)
    weight_mb = (3 * D_MODEL * D_FF * 4) / 2**20
    print(f"tensor-parallel MLP benchmark: gated MLP d_model {D_MODEL}, d_ff {D_FF}, x {tuple(x.shape)} "
          f"float32, {weight_mb:.0f} MiB of weights")
    print(f"{os.cpu_count()} cores, 1 thread per process, {ROUNDS} alternating rounds x {REPEATS} timed "
          f"forwards (after {WARMUP} warm-up), pid {os.getpid()}\n")

    single_times: list[float] = []
    tp_times: list[list[float]] = [[] for _ in range(WORLD)]
    tp_reduce: list[list[float]] = [[] for _ in range(WORLD)]
    timed = range(WARMUP, WARMUP + REPEATS)
    wall = time.perf_counter()
    with Ranks(1) as one, Ranks(WORLD) as two:
        for _ in range(ROUNDS):
            single = on_ranks(one, single_forward, x, SEED, repeats=WARMUP + REPEATS)
            single_times += single.elapsed_s(0)[WARMUP:]
            sharded = on_ranks(two, tp_forward, x, SEED, repeats=WARMUP + REPEATS)
            for r in range(WORLD):
                tp_times[r] += sharded.elapsed_s(r)[WARMUP:]
                tp_reduce[r] += [sum(c.duration_s for c in sharded.records("all_reduce", r, i)) for i in timed]
    wall = time.perf_counter() - wall

    # the sharded output must be the unsharded one, on every rank
    max_diff = sharded.max_gap(None, single.first())
    print("correctness (sharded output vs mlp_reference)")
    row("max |difference| over both ranks", f"{max_diff:.2e}", f"(must be <= {ATOL:g})")
    assert max_diff <= ATOL, f"the sharded MLP differs from mlp_reference by {max_diff:.3e} > {ATOL:g}"

    single_s = statistics.median(single_times)
    rank_s = [statistics.median(t) for t in tp_times]
    rank_reduce_s = [statistics.median(t) for t in tp_reduce]
    slow = max(range(WORLD), key=lambda r: rank_s[r])
    two_s = rank_s[slow]
    speedup = single_s / two_s
    efficiency = speedup / WORLD
    # share of each forward spent in the all-reduce, on the slowest rank, median over the repeats
    share = statistics.median(a / t for a, t in zip(tp_reduce[slow], tp_times[slow]))

    print("\nforward time (median)")
    row("single process, 1 thread (mlp_reference)", f"{single_s * 1e3:.2f} ms")
    for r in range(WORLD):
        row(f"rank {r} of {WORLD}, 1 thread: forward", f"{rank_s[r] * 1e3:.2f} ms",
            f"(all-reduce {rank_reduce_s[r] * 1e3:.3f} ms of it)")
    row(f"{WORLD} ranks: forward (slowest rank, rank {slow})", f"{two_s * 1e3:.2f} ms")

    print("\nscaling")
    row(f"speedup (single / {WORLD} ranks)", f"{speedup:.2f}x", f"(ideal {WORLD:.2f}x)")
    row(f"efficiency per device (speedup / {WORLD})", f"{efficiency * 100:.0f} %", "(ideal 100 %)")
    row("share of the 2-rank forward in the all-reduce", f"{share * 100:.1f} %",
        f"({BATCH * SEQ * D_MODEL * 4 / 1024:.0f} KiB summed per forward)")
    print("\n  Efficiency per device falls short of 100 % because the sharded forward adds an all-reduce the "
          "single process\n  does not need; the rest of the gap here is because both ranks share this "
          f"machine's {os.cpu_count()} cores\n  (and its memory bandwidth: at 16 tokens the forward mostly "
          "streams weights) with everything else.")
    print(f"\n  total wall time {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
