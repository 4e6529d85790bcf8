"""Training step time on 4 ranks, every layout, predicted by the training planner's model against measured.

    .venv/bin/python benchmarks/bench_training.py [--runs 3] [--rounds 2]

Fits the toy cluster on the 4 ranks (a latency-bandwidth sweep, the extra time of a call between
computing ranks, the model's forward and backward and AdamW's step timed on every rank at once), then
trains the toy language model (``predict.training.time_model.STEP_TIME_CONFIG``: 4 blocks, d_model 128, 64-token
sequences, 4 sequences a step) on every 4-rank layout: the five that mix two axes and dp4, tp4, pp4. Each layout
runs ``rounds`` times (the order reversed every other round), 4 steps a run, the first a warm-up; the
median of the others is set against the planner's ``score_training`` on the cluster fitted from samples
taken before every run. Prints, per check, the table (each term, predicted, measured, their ratio and
error), the mean error and Spearman's rank correlation; then, over the checks, each layout's band of
measured/predicted and the correlation's range, and for notebook 11's seven layouts (``RANKED_4``) how
many runs passed the floor a random order reaches at most 5 % of the time. No targets: absolute times
move with the machine's load.
"""

from __future__ import annotations

import argparse
import statistics
import time

from shardlib.lab.training.step_time import run_step_time_check
from shardlib.predict.training.toy_prediction import (
    LAYOUTS_4,
    RANKED_4,
    SINGLE_AXIS_4,
    chance_of_correlation,
    floor_for_chance,
)
from shardlib.runtime.ranks import Ranks
from shardlib.ui.training_figures import step_cluster_text, step_time_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="whole checks, each with its own fit (default 3)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of every layout within a check (default 2)")
    args = parser.parse_args()
    layouts = {**LAYOUTS_4, **SINGLE_AXIS_4}
    checks = []
    with Ranks(4) as four:
        print(f"4 ranks: {four.description}")
        for k in range(args.runs):
            start = time.perf_counter()
            check = run_step_time_check(four, layouts=layouts, rounds=args.rounds)
            checks.append(check)
            print(f"\n-- run {k + 1} of {args.runs} ({time.perf_counter() - start:.1f} s, fit and every layout)")
            print(step_cluster_text(check.fit))
            print(step_time_table(check))
    print(f"\n-- over {len(checks)} runs: measured/predicted per layout (min .. max) and its median error")
    for label in layouts:
        rows = [next(t for t in c.layouts if t.label == label) for c in checks]
        ratios, error = [t.ratio for t in rows], statistics.median(t.error for t in rows)
        print(f"{label:<17}{min(ratios):>6.2f} .. {max(ratios):<6.2f} error {error:.0%}")
    rhos = [c.rank_correlation for c in checks]
    five = [c.only(LAYOUTS_4) for c in checks]
    print(f"mean error: {', '.join(f'{c.mean_error:.0%}' for c in checks)}")
    print(f"Spearman, all 8 layouts: {', '.join(f'{r:+.2f}' for r in rhos)} (lowest {min(rhos):+.2f})")
    print(f"Spearman, the five mixed layouts: {', '.join(f'{c.rank_correlation:+.2f}' for c in five)} "
          f"(lowest {min(c.rank_correlation for c in five):+.2f})")
    seven = [c.only(RANKED_4) for c in checks]
    floor = floor_for_chance(len(RANKED_4))
    passed = sum(c.rank_correlation >= floor for c in seven)
    rhos7 = ", ".join(f"{c.rank_correlation:+.2f}" for c in seven)
    print(f"Spearman, notebook 11's {len(RANKED_4)} layouts: {rhos7}; "
          f"{passed} of {len(seven)} at least {floor:.2f} (a random order: {chance_of_correlation(floor, 7):.1%})")


if __name__ == "__main__":
    main()
