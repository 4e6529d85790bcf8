"""Across two "nodes" of this machine, over an emulated slow link: tensor parallelism across them
against pipeline stages across them, measured in steady-state decode beside the planner's prediction.

The planner weighs the two ways a copy of a model can cross nodes (``reasons``): cut every layer across
the link (TP across nodes: two all-reduces per layer cross it) or cut the stack at the link (PP across
nodes: one small message per microbatch crosses it, but the stages run one after another). Here both
run for real on a pool seen as 2 nodes of ``world_size / 2`` ranks, with every call between the nodes
held to the time an ``inter_link`` would take (``lab.costs.emulation``) and every call inside a node left
as it is. The same cluster, with that link between its nodes and this machine's measured arithmetic
speed, gives the planner's ``score`` of each layout, so the table shows predicted and measured side by
side: time between two tokens of a sequence, and tokens per second.
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
from shardlib.lab.serving.drivers import run_decode
from shardlib.lab.serving.ranks import effective_flops_on_rank
from shardlib.lab.verdict import Verdict, verified
from shardlib.predict.serving.decode import Score, score
from shardlib.predict.serving.memory import Workload, weights_per_gpu
from shardlib.predict.serving.reasons import kind
from shardlib.predict.shapes import check_tensor_parallel


@dataclass(frozen=True)
class AcrossRow:
    """One way across the nodes: the planner's score and the medians measured on the ranks."""

    layout: Layout
    kind: str  # "TP across nodes", "PP across nodes", ...
    predicted: Score
    token_interval_s: float  # measured: median time between two tokens of a sequence
    tokens_per_s: float  # measured: the batch's tokens over that interval
    max_error: float  # largest difference from the one-process decode, over every step
    emulated_calls: int  # calls of one run that crossed the emulated link, all ranks together

    @property
    def latency_ratio(self) -> float:
        """Measured over predicted time between two tokens."""
        return self.token_interval_s / self.predicted.decode_step_s


@dataclass(frozen=True)
class AcrossNodes:
    cluster: Cluster
    batch: int
    rows: tuple[AcrossRow, ...]  # PP across nodes first, then TP across nodes
    spans: tuple = ()  # the last run of the pipeline, for a timeline
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
    """Both ways across the nodes (``across_layouts``), each decoded ``repeats`` times for ``steps`` steps
    of ``x`` (batch, 1, d_model) with the link between the nodes emulated; medians of the measured
    intervals beside ``decode.score`` on the same cluster (``AcrossNodes.cluster``: plan on it to see
    the planner rank them). Each rank's memory is capped at ``memory_per_rank_bytes``, by default 3/4
    of one copy's weights, so that, like a large model, one copy does not fit one rank. Inside a node
    the ranks talk over this machine's own link; the planner prices it, where there is one (more
    than 2 ranks), with ``inter_link``'s figures as well, which overstates it."""
    whole_number(repeats, "repeats")
    pipeline, split = across_layouts(ranks.world_size)
    check_tensor_parallel(model, split.tp)
    batch = x.shape[0]
    if batch % pipeline.pp:
        raise ValueError(f"a batch of {batch} sequences cannot be cut into {pipeline.pp} equal microbatches, one "
                         f"per stage")
    # the arithmetic speed of a rank, measured on every rank at once (as they compute in the runs)
    flops = statistics.median(ranks.run(effective_flops_on_rank, model, layers, batch // pipeline.pp, 1))
    g = ranks.world_size // 2
    cap = 0.75 * weights_per_gpu(model, Layout(tp=1, pp=1)) if memory_per_rank_bytes is None else memory_per_rank_bytes
    cluster = toy_cluster(inter_link, memory_per_rank_bytes=cap, flops_per_s=flops, inter_link=inter_link, nodes=2,
                          ranks_per_node=g)
    emulation = EmulatedLink.of_cluster(cluster)
    reference = decode_reference(x, layers, model, steps)  # (steps, batch, 1, d_model)
    rows, spans = [], ()
    for layout in (pipeline, split):
        m = across_workload(batch).microbatches_for(layout.pp, batch)
        predicted = score(model, cluster, layout, across_workload(batch))
        runs = [run_decode(ranks, layout, model, layers, x, m, steps, emulation) for _ in range(repeats)]
        interval_s = statistics.median(r.token_interval_s for r in runs)
        error = max((r.outputs - reference).abs().max().item() for r in runs)
        rows.append(AcrossRow(layout, kind(layout, cluster), predicted, interval_s, batch / interval_s, error,
                              runs[-1].emulated_calls))
        if layout is pipeline:
            spans = runs[-1].spans
    return AcrossNodes(cluster, batch, tuple(rows), spans)


def format_across(result: AcrossNodes) -> str:
    """Predicted against measured, per way across the nodes, as plain text."""
    lines = [f"{'layout':<22}{'across the link':<34}{'ms/token':>9}{'measured':>9}{'ratio':>7}"
             f"{'tokens/s':>10}{'measured':>9}"]
    for r in result.rows:
        p = r.predicted
        lines.append(f"{r.layout.label:<22}{r.kind:<34}{p.decode_step_s * 1e3:>9.2f}{r.token_interval_s * 1e3:>9.2f}"
                     f"{r.latency_ratio:>7.2f}{p.tokens_per_s:>10,.0f}{r.tokens_per_s:>9,.0f}")
    return "\n".join(lines)


BAND = (0.5, 2.0)  # measured / predicted time per token, each way across the nodes


def across_verdicts(result: AcrossNodes) -> tuple[Verdict, ...]:
    """One verdict per way across the nodes: the planner's time per token against the measured median."""
    return tuple(Verdict(f"{row.kind} ({row.layout.label}), time per token", row.predicted.decode_step_s,
                         row.token_interval_s, "s", *BAND) for row in result.rows)


def check_across_nodes(ranks, model: ModelConfig, layers: list[dict], x: torch.Tensor, inter_link: Link,
                       steps: int = 6, repeats: int = 3, attempts: int = 3) -> AcrossNodes:
    """``run_across_nodes``, with its claim checked: each way's measured time per token (the median of
    ``repeats`` runs of ``steps`` decode steps) within a factor of 2 of the planner's, either way. A burst of
    other work on the machine stretches a run and never shortens one, so the whole measurement is taken
    again, at most ``attempts`` times in all, until both hold; the last is kept. Its ``verdicts`` say
    predicted, measured, ratio and verdict in one line each; when strict a verdict that never held
    raises ``AssertionError`` (``lab.verdict.verified``)."""
    result, verdicts = verified(lambda: run_across_nodes(ranks, model, layers, x, inter_link, steps, repeats),
                                across_verdicts, attempts)
    return replace(result, verdicts=verdicts)
