"""Replicas against tensor parallelism: ``n`` copies of a model, or one copy split ``tp = n`` ways, on ``n`` GPUs.

``replicas_vs_tensor_parallel``: the throughput and latency of both from a step's compute and its
communication (a replica's step is the whole compute; the split copy's ``compute / n`` plus its
all-reduces, serving one batch for all ``n``). Notebook 02's live demo predicts its measurement with it.
``latency_vs_throughput`` prices both with the planner's cost model (``decode.score``) on one node: tensor
parallelism shortens the time per token; replicas win throughput per GPU when the model fits; a split copy
frees memory that buys batch, which can win back the all-reduces. Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import number_at_least, positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import GPU, Link, gpu_cluster
from shardlib.predict.serving.decode import score
from shardlib.predict.serving.memory import Workload, layout_problems


@dataclass(frozen=True)
class ReplicasVsTensorParallel:
    """``world_size`` devices as independent replicas, or as one tensor-parallel copy, serving decode steps
    of ``tokens_per_step`` tokens (one per sequence). A replica's step is the whole compute; the
    tensor-parallel step is ``compute / n`` plus its communication, and serves one batch for all ``n``
    devices. A step makes one token of every sequence, so the step *is* the latency per token.
    ``tp_tokens_per_step``: the split copy's batch where it differs (its freed memory buys more; 0: the same)."""

    world_size: int
    tokens_per_step: int
    replica_step_s: float
    tp_step_s: float
    tp_tokens_per_step: int = 0

    @property
    def tp_batch(self) -> int:
        return self.tp_tokens_per_step or self.tokens_per_step

    @property
    def replicas_tokens_per_s(self) -> float:
        return self.world_size * self.tokens_per_step / self.replica_step_s

    @property
    def tp_tokens_per_s(self) -> float:
        return self.tp_batch / self.tp_step_s

    @property
    def replicas_tokens_per_s_per_device(self) -> float:
        return self.replicas_tokens_per_s / self.world_size

    @property
    def tp_tokens_per_s_per_device(self) -> float:
        return self.tp_tokens_per_s / self.world_size

    @property
    def throughput_ratio(self) -> float:
        """Replicas' tokens/s over tensor parallelism's: ``1 + n * comm / compute`` at the same batch,
        never below 1 then."""
        return self.replicas_tokens_per_s / self.tp_tokens_per_s

    @property
    def latency_ratio(self) -> float:
        """Tensor parallelism's latency per token over a replica's: ``1/n + comm / compute``, below 1
        while the communication costs less than the ``1 - 1/n`` of the compute it saves."""
        return self.tp_step_s / self.replica_step_s


def replicas_vs_tensor_parallel(step_compute_s: float, comm_s_per_step: float, world_size: int,
                                tokens_per_step: int, tp_compute_s: float | None = None,
                                tp_tokens_per_step: int = 0) -> ReplicasVsTensorParallel:
    """Throughput of ``world_size`` devices as replicas against one tensor-parallel copy (see the dataclass).

    ``tp_compute_s``: the split copy's compute per step, ``step_compute_s / n`` unless given (a cost model
    that prices the split copy's reads on its own, at its own batch ``tp_tokens_per_step``, passes both)."""
    compute = positive_number(step_compute_s, "step_compute_s")
    number_at_least(comm_s_per_step, "comm_s_per_step (seconds)")
    n = whole_number(world_size, "world_size")
    split = compute / n if tp_compute_s is None else positive_number(tp_compute_s, "tp_compute_s")
    return ReplicasVsTensorParallel(n, whole_number(tokens_per_step, "tokens_per_step"), compute,
                                    split + (comm_s_per_step if n > 1 else 0.0),
                                    whole_number(tp_tokens_per_step, "tp_tokens_per_step", 0))


@dataclass(frozen=True)
class ServingPoint:
    """One way to use ``n_gpus`` GPUs: its batch per copy, per-token latency and tokens per second."""

    label: str  # "4 replicas", "tp = 4"
    layout: Layout
    problem: str  # why it cannot serve ("" when it can)
    batch: int = 0  # sequences per copy, from free memory (up to the workload's max_batch)
    latency_s: float = 0.0  # per token, at that batch
    tokens_per_s: float = 0.0  # all its GPUs together
    latency_alone_s: float = 0.0  # per token, one sequence alone

    @property
    def n_gpus(self) -> int:
        return self.layout.world_size

    @property
    def feasible(self) -> bool:
        return not self.problem

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.n_gpus


def _loaded_and_alone(model, cluster, layout: Layout, workload: Workload):
    """``(problem, loaded score, score of one sequence alone)``; the scores ``None`` when it cannot serve."""
    problems = layout_problems(model, cluster, layout, workload)
    if problems:
        return problems[0], None, None
    return "", score(model, cluster, layout, workload), score(model, cluster, layout, replace(workload, batch=1))


def _point(label: str, model: ModelConfig, cluster, layout: Layout, workload: Workload) -> ServingPoint:
    problem, loaded, alone = _loaded_and_alone(model, cluster, layout, workload)
    if problem:
        return ServingPoint(label, layout, problem)
    return ServingPoint(label, layout, "", loaded.batch, loaded.decode_step_s, loaded.tokens_per_s,
                        alone.decode_step_s)


def latency_vs_throughput(model: ModelConfig, gpu: GPU, link: Link | None = None, degrees=(2, 4, 8),
                          workload: Workload = Workload()) -> tuple[ServingPoint, ...]:
    """One GPU alone, then for each ``n`` in ``degrees``: ``n`` replicas and one copy split ``tp = n`` ways,
    on one node of ``n`` ``gpu`` s joined by ``link`` (the GPU's own node link unless given). The batch
    is sized from free memory unless ``workload`` fixes it."""
    out = [_point("1 GPU", model, gpu_cluster(gpu, 1, 1), Layout(1, 1), workload)]
    for n in degrees:
        cluster = gpu_cluster(gpu, 1, n, intra_link=link)
        out += [_point(f"{n} replicas", model, cluster, Layout(1, 1, n), workload),
                _point(f"tp = {n}", model, cluster, Layout(n, 1, 1), workload)]
    return tuple(out)
