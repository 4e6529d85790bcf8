"""The toy's training step in the training planner's time model (no second model: the planner's, with the
toy's settings, ``TOY_TIME_SETTINGS``, listed once): the layouts ``step_time`` trains, one global batch for
all (``step_config``), the prediction term by term (``predict_step``); Spearman's rank correlation, tied
values sharing their average rank, and how often a random order reaches it. Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import permutations

from shardlib.core.checks import whole_number
from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig
from shardlib.facts.hardware import Cluster
from shardlib.predict.training.time_model import TrainingScore, TrainingWorkload, score_training

# Five 4-rank layouts, each mixing two axes, and three single-axis ones beside them.
LAYOUTS_4 = {
    "dp2 x tp2": Layout(tp=2, pp=1, dp=2),
    "pp2 x tp2": Layout(tp=2, pp=2),
    "dp2 x pp2": Layout(tp=1, pp=2, dp=2),
    "cp2 x tp2": Layout(tp=2, pp=1, cp=2),
    "dp2 x tp2 zero3": Layout(tp=2, pp=1, dp=2, dp_strategy="zero3"),
}
SINGLE_AXIS_4 = {"dp4": Layout(tp=1, pp=1, dp=4), "tp4": Layout(tp=4, pp=1), "pp4": Layout(tp=1, pp=4)}
# What the notebook ranks: the five mixed layouts and the two single-axis ones a 2-layer model can run.
RANKED_4 = {**LAYOUTS_4, "dp4": SINGLE_AXIS_4["dp4"], "tp4": SINGLE_AXIS_4["tp4"]}
# Small enough for a notebook cell, wide enough that a block's matmuls are more than Python's overhead.
STEP_TIME_CONFIG = TrainingConfig(n_layers=4, d_model=128, n_heads=4, n_kv_heads=4, d_ff=512, vocab_size=256,
                                  seq=64, microbatch=1, m=4, steps=4)


def spearman(xs, ys) -> float:
    """Spearman's rank correlation of two equally long sequences: Pearson's correlation of their ranks,
    tied values sharing the average of the ranks they span. 1: same order; -1: reversed."""
    xs, ys = list(xs), list(ys)
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"the rank correlation needs two sequences of the same length, at least 2; got {len(xs)} "
                         f"and {len(ys)} values")
    rx, ry = average_ranks(xs), average_ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    if vx == 0 or vy == 0:
        raise ValueError("the rank correlation is undefined when every value of one sequence is the same")
    return cov / (vx * vy) ** 0.5


def chance_of_correlation(rho: float, n: int) -> float:
    """The probability that ``n`` layouts put in a uniformly random order reach Spearman's correlation
    ``rho`` or more against the true one: exact, over all ``n!`` orders (no ties). Five layouts reach 0.7
    one time in nine; seven layouts, one time in 23."""
    n = whole_number(n, "n (the layouts ranked)", 2)
    if n > 9:
        raise ValueError(f"the exact count walks all n! orders; {n}! is too many: rank at most 9 layouts")
    base = list(range(n))
    hits = total = 0
    for order in permutations(base):
        d2 = sum((a - b) ** 2 for a, b in zip(base, order))
        total += 1
        hits += 1 - 6 * d2 / (n * (n * n - 1)) >= rho - 1e-12
    return hits / total


def floor_for_chance(n: int, chance: float = 0.05) -> float:
    """The smallest Spearman correlation over ``n`` layouts that a random order reaches with probability at
    most ``chance``: the floor a ranking claim must pass to say more than luck."""
    values = sorted({round(1 - 6 * k / (n * (n * n - 1)), 12) for k in range(0, n * (n * n - 1) // 3 + 1, 2)})
    for rho in values:
        if chance_of_correlation(rho, n) <= chance:
            return rho
    return 1.0


def average_ranks(values) -> list[float]:
    """Each value's rank, 1 for the smallest; tied values get the mean of the ranks they occupy."""
    values = list(values)  # those below it, then the middle of the places its ties share
    return [sum(v < x for v in values) + (sum(v == x for v in values) + 1) / 2 for x in values]


def step_config(config: TrainingConfig, layout: Layout, global_sequences: int) -> TrainingConfig:
    """``config`` with ``m`` set so that every layout trains on the same global batch of
    ``global_sequences`` sequences: ``m = global_sequences / (microbatch x dp)``."""
    whole_number(global_sequences, "global_sequences (sequences per step)")
    per = config.microbatch * layout.dp
    if global_sequences % per:
        raise ValueError(f"a global batch of {global_sequences} sequences does not split into microbatches of "
                         f"{config.microbatch} over dp = {layout.dp} replicas ({global_sequences} % {per} != 0)")
    return replace(config, m=global_sequences // per)


# Where the toy's step is not what the planner assumes of a real one: ``TrainingWorkload`` fields, each
# passed to ``score_training`` as it is (``step_workload``), with why. Nothing else differs.
TOY_TIME_SETTINGS = {
    "recompute": ("none",),  # the toy keeps every activation
    "kernel_efficiency": 1.0,  # the toy cluster's FLOP rate is the toy's own measured rate
    "min_ring_slice_tokens": 1,  # cp cuts the toy's short sequences too
    "dp_overlap": False,  # the toy's step runs its data-parallel collectives after its backward
    "comm_in_bubble": True,  # a bubble slot lasts a microbatch's compute and its tp and cp calls (CPU ranks)
}


def toy_config_settings(config: TrainingConfig) -> dict:
    """The settings that follow the toy's ``config``: its sequence and microbatch, its dtype's bytes on the
    wire, and AdamW's pass counted (a toy step has a few hundred tokens: its optimizer step is not
    negligible): AdamW reads the weight, its gradient and two moments, and writes three."""
    return {"sequence_tokens": config.seq, "microbatch_sizes": (config.microbatch,),
            "comm_bytes_per_value": config.element_bytes, "optimizer_bytes_per_param": 7 * config.element_bytes}


def step_workload(config: TrainingConfig, global_sequences: int) -> TrainingWorkload:
    """The planner's workload for the toy at a global batch of ``global_sequences`` sequences: the
    planner's defaults but for ``TOY_TIME_SETTINGS`` and ``toy_config_settings``."""
    return TrainingWorkload(global_batch_tokens=global_sequences * config.seq, **toy_config_settings(config),
                            **TOY_TIME_SETTINGS)


def predict_step(cluster: Cluster, layout: Layout, config: TrainingConfig, global_sequences: int) -> TrainingScore:
    """The training planner's step (``score_training``) for ``layout`` on ``cluster``, term by term."""
    workload = step_workload(config, global_sequences)
    return score_training(config.model, cluster, layout, workload, config.microbatch, workload.recompute[0])
