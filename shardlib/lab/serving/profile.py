"""Where the serving engine's step spends its time: the engine run in one process under cProfile, each function's
own time charged to a group (the attention, the paged cache's reads and writes, the linears, ...).

A function's own time goes to the first group with a mark its ``path:name`` ends with (a mark ending in ":" takes a
whole file), else to its callers' groups, shared as they called it; a torch builtin is named by itself. Shares are
of the wall clock: a busy machine slows every group alike, and CPU-time readings would cost more than the smallest
calls they time. ``benchmarks/bench_serving.py`` prints it for the bench's model; notebook 06 for its own.
"""

from __future__ import annotations

import cProfile
import pstats
import time
from dataclasses import dataclass

from shardlib.core.serving.loop import serve_in_process
from shardlib.core.serving.paged import PagedModel
from shardlib.core.tensor_parallel.layers import TPGroup

PROFILE_GROUPS = {
    "attention": ("paged.py:attend", "paged.py:attend_decodes", "model.py:attention", "model.py:latent_attention"),
    "paged read/write": ("paged.py:read", "paged.py:write", "paged.py:slots"),
    "linears": ("<built-in method torch._C._nn.linear>",),
    "rest of the layers": ("tensor_parallel/blocks.py:forward",),
    "step set-up (indices)": ("paged.py:step", "paged.py:slot_map"),
    "sampling": ("loop.py:sample_step", "loop.py:sample_token"),
    "Python scheduling": ("serving/loop.py:", "serving/scheduler.py:", "serving/blocks.py:", "serving/requests.py:"),
}


def profile_groups(stats: pstats.Stats) -> dict[str, float]:
    """Seconds per group of ``PROFILE_GROUPS`` (and "other") in a cProfile run."""
    def own_group(key):
        label = key[2] if key[0] == "~" else f"{key[0]}:{key[2]}"
        return next((g for g, marks in PROFILE_GROUPS.items()
                     if any(label.endswith(m) or (m.endswith(":") and m in label) for m in marks)), None)

    shares, visiting = {}, set()

    def split(key) -> dict[str, float]:  # the groups this function's time belongs to, as fractions
        if key in shares:
            return shares[key]
        group, callers = own_group(key), stats.stats[key][4]
        if group is not None or not callers or key in visiting:
            return {group or "other": 1.0}
        visiting.add(key)
        weights = {caller: edge[2] for caller, edge in callers.items()}  # its own time under each caller
        total, out = sum(weights.values()), {}
        for caller, w in weights.items():
            for g, f in split(caller).items():
                out[g] = out.get(g, 0.0) + f * (w / total if total else 1 / len(weights))
        visiting.discard(key)
        shares[key] = out
        return out

    seconds = dict.fromkeys([*PROFILE_GROUPS, "other"], 0.0)
    for key, (_, _, own_s, _, _) in stats.stats.items():
        for g, f in split(key).items():
            seconds[g] += own_s * f
    return seconds


@dataclass(frozen=True)
class EngineProfile:
    """The engine's step in one process: its steps, tokens and wall time unprofiled, then each group's seconds
    under cProfile."""

    steps: int
    tokens: int
    wall_s: float
    seconds: dict

    @property
    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values())
        return {g: s / total for g, s in self.seconds.items()}

    def lines(self) -> list[str]:
        head = (f"the engine's step in one process: {self.steps} steps, {self.tokens} tokens computed, "
                f"{self.wall_s:.2f} s, {self.wall_s / self.steps * 1e3:.2f} ms a step; under cProfile:")
        return [head] + [f"  {g:<24}{f:>6.1%}{self.seconds[g] / self.steps * 1e3:>8.2f} ms a step"
                         for g, f in self.shares.items()]


def profile_engine(weights, trace, config) -> EngineProfile:
    """Serve ``trace`` with ``config`` in this process (after a warm-up on its first 4 requests), once timed
    and once under cProfile."""
    model = PagedModel(weights, TPGroup(1, 0), config.num_blocks, config.block_size)
    serve_in_process(trace[:4], config, model.step)  # warm
    steps = []

    def counted(chunks):
        steps.append(sum(len(c.tokens) for c in chunks))
        return model.step(chunks)

    start = time.perf_counter()
    serve_in_process(trace, config, counted)
    wall_s = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.enable()
    serve_in_process(trace, config, model.step)
    profiler.disable()
    return EngineProfile(len(steps), sum(steps), wall_s, profile_groups(pstats.Stats(profiler)))
