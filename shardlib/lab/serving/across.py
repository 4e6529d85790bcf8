"""Across two "nodes" of this machine, over an emulated slow link: tensor parallelism across them
against pipeline stages across them, measured in steady-state decode beside the planner's prediction.

TP across nodes cuts every layer across the link (two all-reduces per layer cross it); PP across nodes
cuts the stack at the link (one small message per microbatch crosses, but the stages run in turn). Both
run on a pool seen as 2 nodes of ``world_size / 2`` ranks, every call between the nodes held to the time
an ``inter_link`` would take (``lab.costs.emulation``). The same cluster, with this machine's measured
arithmetic speed, gives the planner's ``score`` of each layout: time between two tokens, tokens per second.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

import torch

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.toy import decode_reference
from shardlib.facts.hardware import Cluster, Link, toy_cluster
from shardlib.lab.costs.emulation import EmulatedLink
from shardlib.lab.harness import on_ranks
from shardlib.lab.serving.drivers import DecodeRun, effective_flops_per_s, run_decode
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.decode import Score, score
from shardlib.predict.serving.memory import Workload, weights_per_gpu
from shardlib.predict.serving.traffic import kind
from shardlib.predict.shapes import check_tensor_parallel


@dataclass(frozen=True)
class AcrossRow:
    """One way across the nodes: the planner's score beside the decode measured on the ranks (``run``: its
    layout, its times, medians over the repeats) and its largest difference from the one-process decode."""

    kind: str  # "TP across nodes", "PP across nodes", ...
    predicted: Score
    run: DecodeRun
    max_error: float  # over every step of every repeat


@dataclass(frozen=True)
class AcrossNodes:
    """Both ways across the nodes on one ``cluster`` (plan on it to see the planner rank them)."""

    cluster: Cluster
    rows: tuple[AcrossRow, ...]  # PP across nodes first, then TP across nodes
    verdicts: tuple[Verdict, ...] = ()  # predicted against measured time per token, per row (check_across_nodes)


def across_layouts(world_size: int) -> tuple[Layout, Layout]:
    """On 2 nodes of ``world_size / 2`` ranks: TP inside a node with PP across (``tp = g, pp = 2``), and
    TP across both (``tp = 2g, pp = 1``)."""
    whole_number(world_size, "world_size")
    if world_size % 2:
        raise ValueError(f"two nodes need an even number of ranks, got {world_size}")
    g = world_size // 2
    return Layout(tp=g, pp=2), Layout(tp=2 * g, pp=1)


def across_workload(batch: int) -> Workload:
    """What the runs serve: ``batch`` sequences, one token each per step, two microbatches in a pipeline
    (one per stage). The toy keeps no KV cache, so the planner is told of a context of one token."""
    return Workload(batch=batch, context_tokens=1, prompt_tokens=1, microbatches=2)


def run_across_nodes(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, inter_link: Link,
                     steps: int = 6, repeats: int = 3, memory_per_rank_bytes: float | None = None) -> AcrossNodes:
    """Both ways across the nodes (``across_layouts``), each decoding ``x`` (batch, 1, d_model) for ``steps``
    steps, ``repeats`` times, over the emulated link, beside ``decode.score`` on the same cluster. Each
    rank's memory is capped at ``memory_per_rank_bytes``, by default 3/4 of one copy's weights, so that one
    copy does not fit one rank. Inside a node (more than 2 ranks) the planner prices the link between the
    ranks with ``inter_link``'s figures too, which overstates it."""
    whole_number(repeats, "repeats")
    pipeline, split = across_layouts(ranks.world_size)
    check_tensor_parallel(model, split.tp)
    batch = x.shape[0]
    if batch % pipeline.pp:
        raise ValueError(f"a batch of {batch} sequences cannot be cut into {pipeline.pp} equal microbatches, one "
                         f"per stage")
    # the arithmetic speed of a rank, measured on every rank at once (as they compute in the runs)
    flops = statistics.median(on_ranks(ranks, effective_flops_per_s, model, layers, batch // pipeline.pp, 1).each())
    g = ranks.world_size // 2
    cap = 0.75 * weights_per_gpu(model, Layout(tp=1, pp=1)) if memory_per_rank_bytes is None else memory_per_rank_bytes
    cluster = toy_cluster(inter_link, memory_per_rank_bytes=cap, flops_per_s=flops, inter_link=inter_link, nodes=2,
                          ranks_per_node=g)
    emulation = EmulatedLink.of_cluster(cluster)
    reference = decode_reference(x, layers, model, steps)  # (steps, batch, 1, d_model)
    rows = []
    for layout in (pipeline, split):
        m = across_workload(batch).microbatches_for(layout.pp, batch)
        run = run_decode(ranks, layout, model, layers, x, m, steps, emulation, repeats)
        error = max((out - reference).abs().max().item() for out in run.each_repeat_outputs())
        rows.append(AcrossRow(kind(layout, cluster), score(model, cluster, layout, across_workload(batch)), run, error))
    return AcrossNodes(cluster, tuple(rows))


BAND = (0.5, 2.0)  # measured / predicted time per token, each way across the nodes


def across_verdicts(result: AcrossNodes) -> tuple[Verdict, ...]:
    """One verdict per way across the nodes: the planner's time per token against the measured median."""
    return tuple(Verdict(f"{row.kind} ({row.run.layout.label}), time per token", row.predicted.decode_step_s,
                         row.run.token_interval_s, "s", *BAND) for row in result.rows)


def check_across_nodes(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, inter_link: Link,
                       steps: int = 6, repeats: int = 3, attempts: int = 3) -> AcrossNodes:
    """``run_across_nodes`` with its claim checked: each way's time per token within a factor of 2 of the
    planner's. Other work on the machine only stretches a run, so the whole measurement is taken again, up
    to ``attempts`` times in all, until both hold (``lab.verdict.verified``); the last is kept."""
    result, verdicts = verified(lambda: run_across_nodes(ranks, model, layers, x, inter_link, steps, repeats),
                                across_verdicts, attempts)
    return replace(result, verdicts=verdicts)
