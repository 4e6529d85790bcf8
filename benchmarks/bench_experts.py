"""The expert-parallel MoE layer on 2 warm ranks: speed, bytes against the prediction, and the
load-imbalance knob against each mitigation.

    .venv/bin/python benchmarks/bench_experts.py

1. Live re-run: one forward of the layer (TOY_MOE shapes: 8 experts, top-2, d_model 64, d_ff 128) for
   4096 tokens on a warm ``Ranks(2)``, timed from the notebook's side of ``ranks.run`` (shipping the
   batch and weights, routing, both all-to-alls, the experts, the combine, the results coming back).
   Target: at most 0.5 s (median of the timed runs).
2. Bytes: the token rows the comm log recorded in the dispatch all-to-all, against the prediction
   ``tokens * k * d_model * 4`` (``expert_ranks.predicted_all_to_all_bytes``).
3. The knob: max/mean load (per expert and per rank, against the even share of every requested
   token-slot) and the step time (first rank's start to last rank's end, median of repeats) across the
   skew, with no mitigation, a capacity factor of 1.25 (dropping), the same with rerouting, and the
   hottest expert replicated. The experts here are wider (d_ff 1024) so that their compute dominates
   the step, as it does in a real model (Mixtral's d_ff is 14336).

Every output is checked against the single-process layer, exactly. Absolute times move with the
machine's load; the exit status is 1 when the 0.5 s target is missed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import torch

from shardlib.core.experts.dispatch import make_moe_weights
from shardlib.core.experts.routing import MoEConfig
from shardlib.facts.models import TOY_MOE
from shardlib.lab.experts.balance import run_mitigations
from shardlib.lab.experts.drivers import make_tokens, moe_reference, run_expert_parallel
from shardlib.predict.experts import predicted_all_to_all_bytes
from shardlib.runtime.ranks import Ranks

TOKENS = 4096
TARGET_S = 0.5
WARMUP, TIMED = 3, 10
SKEWS = (0.0, 0.25, 0.5, 0.75, 1.0)
KNOB_D_FF = 1024
KNOB_REPEATS = 5
CAPACITY_FACTOR = 1.25


def main() -> int:
    cfg = MoEConfig.from_model(TOY_MOE)
    weights = make_moe_weights(cfg, seed=0)
    x = make_tokens(TOKENS, cfg.d_model, seed=1)
    print(f"expert-parallel MoE benchmark: {TOKENS} tokens, {cfg.n_experts} experts, top-{cfg.k}, d_model "
          f"{cfg.d_model}, d_ff {cfg.d_ff}, float32; {os.cpu_count()} cores, pid {os.getpid()}\n")
    wall = time.perf_counter()
    with Ranks(2) as ranks:
        # 1. the live re-run
        for _ in range(WARMUP):
            run_expert_parallel(ranks, x, weights, cfg)
        times = []
        for _ in range(TIMED):
            t = time.perf_counter()
            run = run_expert_parallel(ranks, x, weights, cfg)
            times.append(time.perf_counter() - t)
        with ranks.same_threads():  # the reference adds its partial sums as a rank does
            exact = torch.equal(run.output, moe_reference(x, weights, cfg, 2).output)
        median_s = statistics.median(times)
        verdict = "meets" if median_s <= TARGET_S else "MISSES"
        print("1. live re-run of the forward on 2 warm ranks (from the caller's side)")
        print(f"   median {median_s * 1e3:.1f} ms, fastest {min(times) * 1e3:.1f} ms, "
              f"slowest {max(times) * 1e3:.1f} ms "
              f"over {TIMED} runs: {verdict} the {TARGET_S} s target; step inside the ranks {run.step_s * 1e3:.1f} ms")
        print(f"   output equals the single-process layer exactly: {exact}\n")
        assert exact, "the layer on ranks differs from the single-process layer"

        # 2. bytes against the prediction
        print("2. dispatch all-to-all bytes (token rows, summed over ranks), measured against predicted")
        print(f"   {'routing':<40} {'measured':>12} {'predicted':>12} {'ratio':>6}  rows leaving their rank")
        for label, c in (("top-2, skew 0", cfg), ("top-2, skew 1", cfg.but(skew=1.0)), ("top-1, skew 0", cfg.but(k=1)),
                         ("top-2, skew 0.75, capacity 1.0 (drops)", cfg.but(skew=0.75, capacity_factor=1.0))):
            r = run_expert_parallel(ranks, x, weights, c)
            predicted = predicted_all_to_all_bytes(TOKENS, c.k, c.d_model)
            print(f"   {label:<40} {r.dispatch_bytes:>12,} {predicted:>12,} {r.dispatch_bytes / predicted:>6.2f}  "
                  f"{r.cross_rank_share:.0%} (uniform routing predicts 50%)")
            assert r.combine_bytes == r.dispatch_bytes
        print("   the prediction counts every token's k rows; a capacity cap drops some before they are sent\n")

        # 3. the knob against each mitigation
        wide = cfg.but(d_ff=KNOB_D_FF)
        wide_weights = make_moe_weights(wide, seed=0)
        print(f"3. the knob (d_ff {KNOB_D_FF}, median of {KNOB_REPEATS} repeats; capacity factor {CAPACITY_FACTOR})")
        run_expert_parallel(ranks, x, wide_weights, wide)  # warm up with the wide experts
        print(f"   {'skew':>4}  {'mitigation':<20} {'expert max/mean':>15} {'rank max/mean':>13} {'dropped':>8} "
              f"{'changed':>8} {'busiest experts: wall':>21} {'CPU':>8} {'step':>9}")
        for skew in SKEWS:
            for mitigation, m in run_mitigations(ranks, x, wide_weights, wide.but(skew=skew),
                                                 capacity_factor=CAPACITY_FACTOR, repeats=KNOB_REPEATS).items():
                assert m.exact, f"skew {skew}, {mitigation}: differs from the single-process layer"
                print(f"   {skew:>4.2f}  {mitigation:<20} {m.expert_load.max_over_mean:>15.2f} "
                      f"{m.rank_load.max_over_mean:>13.2f} "
                      f"{m.run.dropped_slots:>8} {m.tokens_changed:>8} {max(m.run.expert_s) * 1e3:>18.1f} ms "
                      f"{max(m.run.expert_cpu_s) * 1e3:>5.1f} ms {m.run.step_s * 1e3:>6.1f} ms")
        print("\n   max/mean: the busiest expert's (rank's) token-slots over the even share of all requested slots.")
        print("   dropped: token-slots over capacity; changed: tokens whose output differs from the uncapped layer.")
        print("   busiest experts: the slowest rank's expert FFNs, wall clock and the largest CPU time of any rank.")
        print("   Capacity trades quality (dropped slots, changed outputs) for a bounded busiest expert; rerouting")
        print("   keeps most slots but sends them to a less-preferred expert; replication keeps every output and")
        print("   costs one more expert's weights on the second rank.")
    print(f"\n   total wall time {time.perf_counter() - wall:.1f} s")
    return 0 if median_s <= TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
