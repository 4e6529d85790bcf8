"""The planners' own speed: the training planner on 16,384 GPUs and the serving planner on two nodes.

    .venv/bin/python benchmarks/bench_planners.py [--repeats 5]

Each plan is made ``repeats`` times; the fastest and the median are printed beside the number of layouts
it weighed (scored and rejected) and the time per layout, side by side. The tests check what makes the
training planner fast without a clock (the layouts and memory evaluations its pruning leaves); this is
where its time is read. About 0.2 to 0.3 s for the 16K-GPU plan on a quiet 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import time


def timed(make, repeats: int):
    seconds, plan = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        plan = make()
        seconds.append(time.perf_counter() - start)
    return plan, min(seconds), statistics.median(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="plans made per planner (default 5)")
    args = parser.parse_args()

    from shardlib.facts.hardware import H100_80GB, gpu_cluster
    from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_70B
    from shardlib.predict.serving.planner import plan_serving
    from shardlib.predict.training.planner import plan_training
    from shardlib.predict.training.time_model import TrainingWorkload

    cases = {
        "training: Llama-3.1-405B on 16,384 H100s": lambda: plan_training(LLAMA_3_1_405B, gpu_cluster(H100_80GB, 2048),
                                                                          TrainingWorkload()),
        "training: Llama-3-70B on 64 H100s": lambda: plan_training(LLAMA_3_70B, gpu_cluster(H100_80GB, 8),
                                                                   TrainingWorkload()),
        "serving: Llama-3.1-405B on 2 nodes of 8 H100s": lambda: plan_serving(LLAMA_3_1_405B,
                                                                              gpu_cluster(H100_80GB, 2, 8)),
    }
    print(f"{'plan':<48}{'layouts':>8}{'fastest s':>11}{'median s':>10}{'ms/layout':>11}")
    for label, make in cases.items():
        plan, fastest, median = timed(make, args.repeats)
        layouts = len(plan.ranked) + len(plan.rejected)
        print(f"{label:<48}{layouts:>8}{fastest:>11.3f}{median:>10.3f}{fastest / layouts * 1e3:>11.2f}")


if __name__ == "__main__":
    main()
