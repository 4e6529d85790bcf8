"""Replicas against one tensor-parallel copy, served on ranks, a decode step of each way in turn.

Two devices can serve as two replicas (each a whole copy, talking to nobody) or as one copy split two ways
(``core.tensor_parallel.blocks.ParallelBlock``: one all-reduce per layer). ``serve_both_ways_on_rank`` runs
one step each way, so both see the same machine load; ``run_replicas_vs_tp`` keeps each way's median step
and sets it beside ``predict.serving.replicas``' prediction from the replicas' step and a link.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.model import stack_reference
from shardlib.core.tensor_parallel.blocks import ParallelBlock
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.toy import stack_weights
from shardlib.facts.hardware import Link
from shardlib.lab.costs.calibration import group_size, leading_group
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.alpha_beta import all_reduce_s
from shardlib.predict.serving.replicas import ReplicasVsTensorParallel, replicas_vs_tensor_parallel

SERVING_BAND = 2.0  # replicas against a split copy: measured within 2x of the prediction


def serving_model(n_layers: int = 4, d_model: int = 512, d_ff: int = 2048) -> ModelConfig:
    """The serving demo's stack: ``n_layers`` of the toy's MLP layers, float32 (heads unused), wide enough
    that arithmetic, not Python's overhead per call, sets a step's time."""
    return ModelConfig("serving stack", n_layers=n_layers, d_model=d_model, n_heads=1, n_kv_heads=1, d_ff=d_ff,
                       vocab_size=1, bytes_per_param=4.0)


def requests(seed: int, batch: int, d_model: int) -> torch.Tensor:
    """One step of one replica's requests: ``batch`` token vectors, ``(batch, d_model)``."""
    return torch.randn(batch, d_model, generator=torch.Generator().manual_seed(seed))


def serve_both_ways_on_rank(ctx, model: ModelConfig, seed: int, batch: int, tp: int | None = None) -> dict | None:
    """One decode step each way on the first ``tp`` ranks (default: all), each a span of its name:
    ``"replica"``, this rank's whole stack on its own requests (``requests(seed + 1 + rank)``), and ``"tp"``,
    the stack split ``tp`` ways serving ``requests(seed + 1)``, rank 0's replica's. Each ``(batch, d_model)``.
    The weights are drawn here from ``seed`` (the same on every rank), not sent: they can be large."""
    mesh, member = leading_group(ctx, tp)
    if not member:
        return None
    layers = stack_weights(model, seed, ("mlp",))
    tpg = TPGroup.world(ctx) if mesh is None else TPGroup.of_mesh(ctx, mesh, "tp")
    blocks = [ParallelBlock(w, model, tpg) for w in layers]
    h = requests(seed + 1, batch, model.d_model)  # (batch, d_model), the same on every rank of the group
    with torch.no_grad():
        with ctx.timeline.span("replica"):
            replica = stack_reference(requests(seed + 1 + ctx.rank, batch, model.d_model), layers, model)
        with ctx.timeline.span("tp"):
            for block in blocks:
                h = block(h)
    return {"replica": replica, "tp": h}


@dataclass(frozen=True)
class ReplicasVsTPRun:
    """Both ways of serving, each timed step after the warm-up: ``measured`` (each way's median step) and
    ``predicted`` (a tp step: the replicas' measured step over tp, plus one all-reduce per layer)."""

    got: Measured
    replica_steps_s: tuple[float, ...]  # every step, the slowest replica
    tp_steps_s: tuple[float, ...]  # from the last rank's start (an earlier one waits) to the last end
    tp_all_reduce_s_per_step: float  # the median step's time inside the all-reduces, slowest rank
    predicted_comm_s_per_step: float  # the bytes of those all-reduces over the link
    max_output_gap: float  # the tensor-parallel outputs against rank 0's replica: the same requests
    measured: ReplicasVsTensorParallel
    predicted: ReplicasVsTensorParallel


def run_replicas_vs_tp(ranks, link: Link, model: ModelConfig | None = None, batch: int = 8, steps: int = 12,
                       tp: int | None = None, seed: int = 0) -> ReplicasVsTPRun:
    """Serve ``steps`` steps (after one untimed) both ways on the first ``tp`` ranks of ``ranks`` (all of
    them by default), a step of each in turn (``serve_both_ways_on_rank``), so both see the same load."""
    model = serving_model() if model is None else model
    n = group_size(ranks, tp, "tp")
    if model.d_ff % n:
        raise ValueError(f"d_ff = {model.d_ff} cannot be split {n} ways")
    whole_number(batch, "batch"), whole_number(steps, "steps")
    got = on_ranks(ranks, serve_both_ways_on_rank, model, seed, batch, n, repeats=steps + 1)
    timed = range(1, steps + 1)
    replica_steps = tuple(max(s.duration_s for s in got.spans("replica", repeat=i)) for i in timed)
    tp_steps = tuple(max(s.end_s for s in spans) - max(s.start_s for s in spans)
                     for spans in (got.spans("tp", repeat=i) for i in timed))
    inside = statistics.median(max(sum(r.duration_s for r in got.records("all_reduce", rank, i)) for rank in got.ranks)
                               for i in timed)
    comm_s = model.n_layers * all_reduce_s(batch * model.d_model * 4, n, link)  # float32, per ring step
    measured = ReplicasVsTensorParallel(n, batch, statistics.median(replica_steps), statistics.median(tp_steps))
    return ReplicasVsTPRun(got, replica_steps, tp_steps, inside, comm_s, got.max_gap("tp", got.first("replica")),
                           measured, replicas_vs_tensor_parallel(measured.replica_step_s, comm_s, n, batch))


def replicas_vs_tp_verdicts(run: ReplicasVsTPRun) -> tuple[Verdict, ...]:
    """Within ``SERVING_BAND`` of the cost model: the tensor-parallel step; its latency per token over a
    replica's (under 1 too: it answers sooner); the replicas' tokens per second over its own (over 1 too:
    replicas serve more at the same batch). Reads ``run.measured`` and ``run.predicted`` alone."""
    measured, predicted = run.measured, run.predicted
    tp = measured.world_size
    return (Verdict(f"the tp = {tp} step", predicted.tp_step_s, measured.tp_step_s, "s",
                    1 / SERVING_BAND, SERVING_BAND),
            Verdict.one_sided(f"latency per token, tp = {tp} over a replica", predicted.latency_ratio,
                              measured.latency_ratio, "x", at_most=1.0, within=SERVING_BAND),
            Verdict.one_sided(f"tokens per second per device, replicas over tp = {tp}",
                              predicted.throughput_ratio, measured.throughput_ratio, "x", at_least=1.0,
                              within=SERVING_BAND))


def run_replicas_vs_tp_step_check(ranks, link: Link, attempts: int = 3,
                             **kwargs) -> tuple[ReplicasVsTPRun, tuple[Verdict, ...]]:
    """``run_replicas_vs_tp`` (arguments as it takes them), measured again while a verdict does not hold."""
    return verified(lambda: run_replicas_vs_tp(ranks, link, **kwargs), replicas_vs_tp_verdicts, attempts)
