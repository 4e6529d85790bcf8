"""The GPU path, checked where there are GPUs: NCCL ranks, one GPU each.

    python scripts/gpu_check.py

For each world size of 1, 2, 4 and 8 that the GPUs allow, it starts ``Ranks(n, backend="nccl")`` and
checks: every rank on its own GPU; a first all-reduce; the tensor-parallel MLP and attention blocks
(forward and backward, on the GPUs) against the unsharded blocks on the CPU; and an all-reduce size
sweep, printed with the bus bandwidth as nccl-tests reports it. NCCL needs one GPU per rank, so a
machine with one GPU checks world size 1 only (the NCCL set-up, the device placement, and the blocks).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardlib import Ranks  # noqa: E402
from shardlib.models import TOY  # noqa: E402
from shardlib.runtime.basics import all_reduce_time_on_rank, first_all_reduce_on_rank, whoami_on_rank  # noqa: E402
from shardlib.tensor_parallel import run_tp_block  # noqa: E402
from shardlib.toy import activations, layer_weights  # noqa: E402

TOLERANCE = 1e-4  # float32 on GPU against float32 on CPU: the summation order differs


def check_world(n: int) -> None:
    started = time.perf_counter()
    with Ranks(n, backend="nccl", timeout=300) as ranks:
        print(f"\n== world size {n}: backend {ranks.backend}, started in {time.perf_counter() - started:.1f} s")
        who = ranks.run(whoami_on_rank)
        devices = [w["device"] for w in who]
        print("devices:", devices)
        assert ranks.backend == "nccl" and devices == [f"cuda:{r}" for r in range(n)], devices
        sums = ranks.run(first_all_reduce_on_rank)
        expected = [float(sum(r + 1 for r in range(n)))] * 4
        assert all(s["after"] == expected for s in sums), sums
        print(f"first all-reduce: {sums[0]['before']} -> {sums[0]['after']} on every rank")

        w, x, grad = layer_weights(TOY, seed=0), activations(2, 6, TOY.d_model, seed=1), activations(2, 6, TOY.d_model, seed=2)
        for part in ("mlp", "attention"):
            if part == "attention" and TOY.n_kv_heads % n:
                print(f"{part}: skipped, {TOY.n_kv_heads} KV heads cannot be split {n} ways")
                continue
            run = run_tp_block(ranks, part, x, w, TOY, grad)  # the blocks on the GPUs, the reference on the CPU
            print(f"{part}: output gap {run.output_gap:.2e}, input-gradient gap {run.grad_x_gap:.2e} "
                  f"(tolerance {TOLERANCE:g}); {run.forward_collectives[0]} collective(s) forward")
            assert run.output_gap < TOLERANCE and run.grad_x_gap < TOLERANCE

        print(f"{'bytes':>14} {'time':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}")
        for log2 in range(10, 29, 3):
            size_bytes = 4 * 2 ** log2
            seconds = max(ranks.run(all_reduce_time_on_rank, 2 ** log2))
            algbw = size_bytes / seconds / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print(f"{size_bytes:>14,} {seconds * 1e6:>8.1f} us {algbw:>11.2f} {busbw:>11.2f}")


def main() -> int:
    gpus = torch.cuda.device_count()
    print(f"torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}, GPUs: {gpus}")
    for i in range(gpus):
        print(f"  cuda:{i}: {torch.cuda.get_device_name(i)}")
    if not gpus:
        print("no GPU: nothing to check here (the CPU path is what `make test` runs)")
        return 0
    for n in (1, 2, 4, 8):
        if n <= gpus:
            check_world(n)
    print("\nGPU path: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
