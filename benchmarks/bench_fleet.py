"""Replicas behind a router on real ranks: the routing policies on a hot-prefix trace, then replicas against
one copy split over every rank on a mixed trace; each predicted on its fitted step cost first.

    .venv/bin/python benchmarks/bench_fleet.py [--world 4] [--requests 32] [--rate 300] [--section all]

Timings on a shared machine swing with its load: the ratios between two runs back to back hold better.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from shardlib import Ranks
from shardlib.serving.engine import EngineConfig, poisson_trace
from shardlib.serving.engine.llama import LlamaConfig, random_weights
from shardlib.serving.fleet import (
    HOT_PREFIX_POLICIES,
    hot_prefix_trace,
    run_replicas,
    run_replicas_vs_tp_check,
    run_router_check,
)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=4)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--rate", type=float, default=300.0, help="requests per second")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="sequences a replica runs at once")
    parser.add_argument("--section", choices=("all", "router", "layouts"), default="all")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model = LlamaConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, max_positions=128)
    weights = random_weights(model, seed=0, dtype=torch.float64)
    config = EngineConfig(block_size=8, num_blocks=64, max_batch_tokens=64, max_num_seqs=args.max_num_seqs)
    with Ranks(args.world, timeout=120) as ranks:
        run_replicas(ranks, weights, hot_prefix_trace(4, seed=9), config, replicas=args.world)  # warm the pool
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        if args.section in ("all", "router"):
            trace = hot_prefix_trace(args.requests, args.rate, seed=0)
            start = time.perf_counter()
            check = run_router_check(ranks, weights, trace, config, HOT_PREFIX_POLICIES, attempts=1,
                                     fit_requests=hot_prefix_trace(args.requests, args.rate, seed=5))
            print(f"\n{args.world} replicas, {args.requests} requests at {args.rate:g}/s, "
                  f"{sum(r.request_id.startswith('h') for r in trace)} under one system prompt "
                  f"({time.perf_counter() - start:.1f} s)")
            print(check.table())
            print("most queued at one replica:", {row["policy"]: row["max_queued"] for row in check.rows()})
            for v in check.verdicts:
                print(v.line)
        if args.section in ("all", "layouts"):
            trace = poisson_trace(args.requests * 3 // 4, args.rate * 2 / 3, seed=0)
            fit = poisson_trace(args.requests * 3 // 4, args.rate * 2 / 3, seed=5)
            for replicas in sorted({args.world, args.world // 2} - {1}, reverse=True):
                start = time.perf_counter()
                vs = run_replicas_vs_tp_check(ranks, weights, trace, config, fit, replicas=replicas, attempts=1)
                print(f"\n{vs.labels[0]} against {vs.labels[1]} ({time.perf_counter() - start:.1f} s)")
                print(vs.table())
                for v in vs.verdicts:
                    print(v.line)
                if vs.planner is not None:
                    p = vs.planner
                    print(f"planner on the fits: a replica's step {p.replica_step_s * 1e3:.1f} ms at batch "
                          f"{p.tokens_per_step}, the split copy's {p.tp_step_s * 1e3:.1f} ms at batch {p.tp_batch}: "
                          f"replicas serve {p.throughput_ratio:.2f}x the tokens/s; tp's latency {p.latency_ratio:.2f}x")


if __name__ == "__main__":
    main()
