"""Communication costs measured on a pool, each beside its prediction.

* ``run_calibration``: this machine's latency and bandwidth, fitted to a sweep of message sizes.
* ``run_tp_comm_replay``: the all-reduces of a tensor-parallel forward pass, replayed.
* ``run_slow_rank``: one rank delayed; how long every rank then spends inside each collective.
* ``run_replicas_vs_tp``: replicas against one tensor-parallel copy, tokens per second measured and
  predicted.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


from ..checks import whole_number
from ..hardware import Link
from ..models import ModelConfig
from .alpha_beta import all_reduce_s
from .calibration import (DEFAULT_CALLS, DEFAULT_ROUNDS, DEFAULT_SIZES_BYTES, SWEEP_OPS, Calibration, check_sizes,
                          fastest_of_slowest, fit_link)
from .phases import ReplicasVsTensorParallel, replicas_vs_tensor_parallel
from .ranks import (replica_serve_on_rank, slow_rank_on_rank, sweep_on_rank, tp_comm_replay_on_rank,
                    tp_serve_on_rank)


def run_calibration(ranks, sizes_bytes=DEFAULT_SIZES_BYTES, rounds: int = DEFAULT_ROUNDS, calls: int = DEFAULT_CALLS,
              latency_charge: str = "per_step") -> Calibration:
    """Run ``sweep_on_rank`` on ``ranks`` (a ``Ranks`` pool) and fit this machine's latency and bandwidth."""
    if ranks.world_size < 2:
        raise ValueError(f"a communication sweep needs at least 2 ranks, got a pool of {ranks.world_size}")
    for name, value in (("rounds", rounds), ("calls", calls)):
        whole_number(value, name)
    check_sizes(sizes_bytes, ranks.world_size)
    start = time.perf_counter()
    samples = fastest_of_slowest(ranks.run(sweep_on_rank, tuple(sizes_bytes), rounds, calls), ranks.world_size)
    per_op = {op: fit_link([s for s in samples if s.op == op], latency_charge) for op in SWEEP_OPS}
    overall = fit_link(samples, latency_charge)
    return Calibration(tuple(samples), overall, per_op, time.perf_counter() - start, latency_charge, ranks.backend)


@dataclass(frozen=True)
class TPCommReplay:
    """``passes``: per repeat, the slowest rank's seconds for one forward pass's all-reduces (a pass
    ends for everybody when its last rank is done)."""

    tokens: int
    passes: tuple[float, ...]

    @property
    def fastest_s(self) -> float:
        return min(self.passes)

    @property
    def median_s(self) -> float:
        return statistics.median(self.passes)


def run_tp_comm_replay(ranks, model: ModelConfig, tokens: int, repeats: int = 7) -> TPCommReplay:
    """Replay the ``2 x n_layers`` all-reduces of a tensor-parallel forward pass of ``tokens`` tokens."""
    per_rank = ranks.run(tp_comm_replay_on_rank, model, whole_number(tokens, "tokens"), whole_number(repeats, "repeats"))
    return TPCommReplay(tokens, tuple(max(times) for times in zip(*per_rank)))


@dataclass(frozen=True)
class SlowRankRun:
    """``per_rank[r][op]``: rank ``r``'s ``step_s`` (from leaving the barrier to the collective's end)
    and ``collective_s`` (inside the collective) for each op of ``ranks.SLOW_RANK_OPS``."""

    slow_rank: int
    delay_s: float
    per_rank: tuple[dict, ...]
    spans: tuple = ()

    @property
    def ops(self) -> list[str]:
        return list(self.per_rank[0])

    def step_s(self, op: str) -> float:
        """The step of ``op``: it ends for everybody when the slowest rank is done."""
        return max(res[op]["step_s"] for res in self.per_rank)

    def inside_s(self, rank: int) -> float:
        """Seconds ``rank`` spent inside collectives, over every op."""
        return sum(v["collective_s"] for v in self.per_rank[rank].values())


def run_slow_rank(ranks, slow_rank: int, delay_s: float) -> SlowRankRun:
    """Rank ``slow_rank`` sleeps ``delay_s`` before each collective of ``SLOW_RANK_OPS``."""
    per_rank = ranks.run(slow_rank_on_rank, slow_rank, delay_s)
    return SlowRankRun(slow_rank, delay_s, tuple(per_rank), tuple(ranks.last_spans))


def serving_model(n_layers: int = 8, d_model: int = 256, d_ff: int = 1024) -> ModelConfig:
    """The stack the serving demo runs: ``n_layers`` of the toy's MLP layers, float32 (heads unused)."""
    return ModelConfig("serving stack", n_layers=n_layers, d_model=d_model, n_heads=1, n_kv_heads=1, d_ff=d_ff,
                       vocab_size=1, bytes_per_param=4.0)


@dataclass(frozen=True)
class ReplicasVsTPRun:
    """Both ways of serving, ``measured`` (the median step times of alternating rounds) and
    ``predicted`` by the cost model from the replicas' measured compute and the link's all-reduce time,
    each a ``phases.ReplicasVsTensorParallel``; and the largest gap between the tensor-parallel outputs
    and rank 0's replica, which served the same requests."""

    measured: ReplicasVsTensorParallel
    predicted: ReplicasVsTensorParallel
    tp_all_reduce_s_per_step: float  # measured: time inside the all-reduces (moving bytes, and waiting)
    predicted_comm_s_per_step: float
    max_output_gap: float


def run_replicas_vs_tp(ranks, link: Link, model: ModelConfig | None = None, batch: int = 4, steps: int = 15,
                       rounds: int = 3, seed: int = 0, latency_charge: str = "per_step") -> ReplicasVsTPRun:
    """Serve on ``ranks`` both ways, in ``rounds`` alternating rounds so both see the same machine load.

    The prediction takes each replica's measured compute time per step and ``link``'s all-reduce time
    (one all-reduce of ``batch x d_model`` float32 values per layer)."""
    model = serving_model() if model is None else model
    n = ranks.world_size
    if model.d_ff % n:
        raise ValueError(f"d_ff = {model.d_ff} cannot be split {n} ways")
    for name, value in (("batch", batch), ("steps", steps), ("rounds", rounds)):
        whole_number(value, name)
    replica_s, tp_s, tp_reduce_s = [], [], []
    for _ in range(rounds):
        replicas = ranks.run(replica_serve_on_rank, model, seed, batch, steps)
        tp = ranks.run(tp_serve_on_rank, model, seed, batch, steps)
        replica_s.append(max(r["seconds"] for r in replicas))  # the group is done when its slowest is
        tp_s.append(max(r["seconds"] for r in tp))
        tp_reduce_s.append(max(r["all_reduce_s"] for r in tp))
    replica_step_s, tp_step_s = statistics.median(replica_s) / steps, statistics.median(tp_s) / steps
    comm_per_step_s = model.n_layers * all_reduce_s(batch * model.d_model * 4, n, link, latency_charge)
    gap = max(float((r["outputs"] - replicas[0]["outputs"]).abs().max()) for r in tp)
    measured = ReplicasVsTensorParallel(n, batch, replica_step_s, tp_step_s)
    predicted = replicas_vs_tensor_parallel(replica_step_s, comm_per_step_s, n, batch)
    return ReplicasVsTPRun(measured, predicted, statistics.median(tp_reduce_s) / steps, comm_per_step_s, gap)
