"""Pipeline parallelism on real ranks: the bubble measured against the formula, microbatches in flight,
a slow stage, and how long a live re-run takes.

    .venv/bin/python benchmarks/bench_pipeline.py
    .venv/bin/python benchmarks/bench_pipeline.py zero-bubble [zb-v ...]   # section 6 only (those schedules)

The model is 8 pre-norm residual gated-MLP layers (d_model 32, d_ff 64), a batch of 16 x 4 tokens,
float32; rank ``r`` holds stage ``r``'s slice of the layers. For the bubble, every forward and every
backward is padded with sleep to a set duration (uniform stages), so the schedule, not the two shared
cores, decides the timeline; the layers still compute for real. The idle fraction is measured from the
compute spans: over the window from the first compute start to the last compute end across ranks,
``1 - busy / (p x window)``. Each grid point is measured ``REPEATS`` times after a warm-up; the median is
reported with the spread. The live re-run is timed with real compute only (no padding) and with the
set duration the notebook's slider uses.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

N_LAYERS, BATCH, SEQ, D_MODEL, D_FF = 8, 16, 4, 32, 64
GRID_P = (2, 4)
GRID_M = (1, 2, 4, 8, 16)
GRID_OP_S = {"gpipe": 0.05, "1f1b": 0.1}  # set duration of each forward and each backward
INTERLEAVED_OP_S = 0.2  # twice the messages of 1F1B, on paths with no slack: longer ops keep latency small
REPEATS = 3
TOLERANCE = 0.03
SLIDER_OP_S = 0.02  # notebook 03's slider
RERUN_TARGET_S = 1.0
RERUNS = 10


def row(label: str, value: str, note: str = "") -> None:
    print(f"  {label:<58} {value:>16}   {note}")


def main() -> int:
    if sys.argv[1:2] == ["zero-bubble"]:
        return zero_bubble_only(sys.argv[2:] or ZB_SCHEDULES)
    import torch

    from shardlib.core.config import ModelConfig
    from shardlib.core.pipeline.registry import make_schedule
    from shardlib.core.toy import activations, stack_weights
    from shardlib.lab.pipeline.step import run_pipeline, unpipelined_step
    from shardlib.predict.pipeline import peak_in_flight, pipeline_bubble_fraction, predicted_step_s
    from shardlib.runtime.ranks import Ranks

    model = ModelConfig("pipeline benchmark", n_layers=N_LAYERS, d_model=D_MODEL, n_heads=4, n_kv_heads=2, d_ff=D_FF,
                        vocab_size=64, bytes_per_param=4.0)
    layers = stack_weights(model, seed=0, parts=("mlp",))
    x, grad = activations(BATCH, SEQ, D_MODEL, seed=1), activations(BATCH, SEQ, D_MODEL, seed=2)

    def run_on(pool, schedule, layers, x, grad_output=None, forward_s=None, backward_s=None, repeats=1):
        return run_pipeline(pool, schedule, model, layers, x, grad_output, forward_s, backward_s, repeats=repeats)
    print(f"pipeline benchmark: {N_LAYERS} layers (d_model {D_MODEL}, d_ff {D_FF}), batch {BATCH} x {SEQ} tokens, "
          f"{os.cpu_count()} cores, pid {os.getpid()}\n")
    wall = time.perf_counter()
    worst = 0.0
    with Ranks(2) as two, Ranks(4) as four:
        pools = {2: two, 4: four}
        for pool in pools.values():  # warm-up: imports on every rank, first messages
            run_on(pool, make_schedule("1f1b", pool.world_size, 2), layers, x, grad, forward_s=0.001, backward_s=0.001)

        print("1. the bubble, measured against (p - 1) / (m + p - 1): training steps, uniform stages")
        print(f"   median of {REPEATS} runs per point (spread in brackets); tolerance {TOLERANCE}\n")
        for name, op_s in GRID_OP_S.items():
            print(f"   {make_schedule(name, 2, 1).short_title}, each forward and backward padded to "
                  f"{op_s * 1e3:.0f} ms")
            print(f"   {'p':>3} {'m':>4} {'formula':>9} {'measured':>9} {'spread':>17} {'diff':>8} {'ratio':>7}")
            for p in GRID_P:
                for m in GRID_M:
                    schedule = make_schedule(name, p, m)
                    runs = [b.idle_fraction for b in run_on(pools[p], schedule, layers, x, grad, forward_s=op_s,
                                                            backward_s=op_s, repeats=REPEATS).bubbles]
                    measured, predicted = statistics.median(runs), pipeline_bubble_fraction(p, m)
                    worst = max(worst, abs(measured - predicted))
                    print(f"   {p:>3} {m:>4} {predicted:>9.3f} {measured:>9.3f}   [{min(runs):.3f}, {max(runs):.3f}] "
                          f"{measured - predicted:>+8.3f} {measured / predicted:>7.3f}")
            print()
        row("largest |measured - formula| over both grids", f"{worst:.3f}",
            "(within tolerance)" if worst <= TOLERANCE else f"(OVER the {TOLERANCE} tolerance)")

        print(f"\n2. interleaved 1F1B (v = 2 model chunks per rank): (p - 1) / (v m + p - 1), a stage's forward and "
              f"backward padded to {INTERLEAVED_OP_S * 1e3:.0f} ms ({INTERLEAVED_OP_S * 1e3 / 2:.0f} ms per chunk)")
        for m in (4, 8):
            schedule = make_schedule("interleaved-1f1b", 4, m, n_chunks=2)
            runs = [b.idle_fraction for b in run_on(four, schedule, layers, x, grad, forward_s=INTERLEAVED_OP_S,
                                                    backward_s=INTERLEAVED_OP_S, repeats=REPEATS).bubbles]
            row(f"p = 4, m = {m}: formula {pipeline_bubble_fraction(4, m, 2):.3f} (plain 1F1B "
                f"{pipeline_bubble_fraction(4, m):.3f})", f"{statistics.median(runs):.3f}",
                f"[{min(runs):.3f}, {max(runs):.3f}]")

        print("\n3. microbatches in flight per stage (activations kept for the backward), p = 4, m = 8")
        for name in ("gpipe", "1f1b"):
            schedule = make_schedule(name, 4, 8)
            run = run_on(four, schedule, layers, x, grad)
            row(f"{schedule.short_title}: from the schedule", str(list(peak_in_flight(schedule))))
            row(f"{schedule.short_title}: measured on the ranks", str(list(run.peak_in_flight)))
            row(f"{schedule.short_title}: peak activation memory measured (KiB)",
                str([round(b / 1024) for b in run.peak_activation_bytes]))
        for name in ("gpipe", "1f1b"):
            run = run_on(two, make_schedule(name, 2, 8), layers, x, grad)
            row(f"{make_schedule(name, 2, 8).short_title}, p = 2, m = 8: measured in flight",
                str(list(run.peak_in_flight)))

        print("\n4. a slow stage sets the pace: forward only, p = 4, m = 8, 20 ms per forward, stage 1 at 40 ms")
        schedule = make_schedule("gpipe", 4, 8, training=False)
        slow = [0.02, 0.04, 0.02, 0.02]
        for label, durations in (("uniform", 0.02), ("stage 1 twice as slow", slow)):
            steps = run_on(four, schedule, layers, x, forward_s=durations, repeats=REPEATS).bubbles
            measured = statistics.median(b.window_s for b in steps)
            predicted = predicted_step_s(schedule, durations, 0)
            row(f"{label}: step predicted {predicted * 1e3:.0f} ms, measured", f"{measured * 1e3:.0f} ms",
                f"(ratio {measured / predicted:.3f})")
        busy = [b / steps[-1].window_s for b in steps[-1].busy_s]
        row("share of the step each stage computes (slow stage 1)", str([f"{b:.2f}" for b in busy]))

        print(f"\n5. a live re-run of a p = 4, m = 8 training step on the warm ranks (target <= {RERUN_TARGET_S:g} s)")
        reference = unpipelined_step(model, layers, x, 8, grad)
        for name in ("gpipe", "1f1b"):
            schedule = make_schedule(name, 4, 8)
            for label, op_s in (("real compute", None), (f"ops padded to {SLIDER_OP_S * 1e3:.0f} ms", SLIDER_OP_S)):
                times = []
                for _ in range(RERUNS):
                    start = time.perf_counter()
                    run = run_on(four, schedule, layers, x, grad, forward_s=op_s, backward_s=op_s)
                    times.append(time.perf_counter() - start)
                assert torch.equal(run.output, reference["output"]), "the pipelined output differs"
                verdict = "ok" if max(times) <= RERUN_TARGET_S else "OVER TARGET"
                row(f"{schedule.short_title}, {label}: median (max) of {RERUNS}",
                    f"{statistics.median(times) * 1e3:.0f} ms", f"({max(times) * 1e3:.0f} ms) {verdict}")
        zero_bubble_section(pools, model, layers, x, grad)
    print(f"\n  total wall time {time.perf_counter() - wall:.1f} s")
    return 0


ZB_OP_S = 0.06  # each stage's F and B; W is ZB_W_COSTS times this
ZB_W_COSTS = (1.0, 0.5, 2.0)

def _zero_bubble_schedules() -> tuple[str, ...]:
    """1F1B and every schedule of the registry with the backward split (the pure registry: no ranks start)."""
    from shardlib.core.pipeline.registry import SPLIT_SCHEDULES

    return ("1f1b",) + SPLIT_SCHEDULES


ZB_SCHEDULES = _zero_bubble_schedules()


def zero_bubble_only(names) -> int:
    """Section 6 alone, for the schedules named (a sweep of its own takes minutes)."""
    from shardlib.core.config import ModelConfig
    from shardlib.core.pipeline.registry import make_schedule
    from shardlib.core.toy import activations, stack_weights
    from shardlib.lab.pipeline.step import run_pipeline
    from shardlib.runtime.ranks import Ranks

    model = ModelConfig("pipeline benchmark", n_layers=N_LAYERS, d_model=D_MODEL, n_heads=4, n_kv_heads=2, d_ff=D_FF,
                        vocab_size=64, bytes_per_param=4.0)
    layers = stack_weights(model, seed=0, parts=("mlp",))
    x, grad = activations(BATCH, SEQ, D_MODEL, seed=1), activations(BATCH, SEQ, D_MODEL, seed=2)
    wall = time.perf_counter()
    with Ranks(2) as two, Ranks(4) as four:
        for pool in (two, four):  # warm-up: imports on every rank, first messages
            run_pipeline(pool, make_schedule("1f1b", pool.world_size, 2), model, layers, x, grad, 0.001, 0.001)
        zero_bubble_section({2: two, 4: four}, model, layers, x, grad, tuple(names))
    print(f"\n  total wall time {time.perf_counter() - wall:.1f} s")
    return 0


def zero_bubble_section(pools, model, layers, x, grad, names=ZB_SCHEDULES) -> None:
    """6. The schedules past 1F1B: the idle share measured against the published formula and against the
    list's own prediction, both evaluated with F, B and W measured on the ranks, and the list's prediction
    again with the hand-over between stages measured on the ranks added to every message; p = 2 and 4."""
    from shardlib.lab.pipeline.zero_bubble import SplitCase, run_split_step

    print(f"\n6. zero bubble: F and B padded to {ZB_OP_S * 1e3:.0f} ms per stage, W to a share of it; "
          f"median of {REPEATS} runs; published formula with measured F, B, W (B: the input gradient;\n"
          "   ZB-V's: zero inside each device's span at F = B = W, so (p-1) F over one step); 'list': simulate\n"
          "   of the same list, 'list+hops': the same with the measured hand-over (ms) on every message")
    print(f"   {'schedule':10} {'p':>3} {'m':>4} {'W/F':>5} {'formula':>9} {'list':>7} {'list+hops':>10} {'hop':>5} "
          f"{'measured':>9} {'diff':>7}  chunks held")
    for p, pool in pools.items():
        for w in ZB_W_COSTS:
            for name in names:
                for m in (2 * p, 4 * p):
                    r = run_split_step(pool, SplitCase(name, m, w), model, layers, x, grad, ZB_OP_S, REPEATS)
                    formula = "-" if r.published is None else f"{r.published:.3f}"
                    diff = "" if r.published is None else f"{r.measured_idle - r.published:+.3f}"
                    print(f"   {name:10} {p:>3} {m:>4} {w:>5g} {formula:>9} {r.predicted_idle:>7.3f} "
                          f"{r.with_hops:>10.3f} {r.handover_s * 1e3:>5.1f} {r.measured_idle:>9.3f} {diff:>7}  "
                          f"{list(r.run.peak_in_flight)}")


if __name__ == "__main__":
    sys.exit(main())
