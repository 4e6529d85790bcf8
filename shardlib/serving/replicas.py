"""Latency against throughput: ``n`` replicas of a model, or one copy split ``tp = n`` ways, on ``n`` GPUs.

Tensor parallelism shortens the time per token (each GPU reads ``1/tp`` of the weights and KV cache, and
decode's latency-bound all-reduces cost less than the reads they save); replicas win throughput per GPU
when the model fits (they send nothing); a split copy frees memory that buys batch, which can win back
the all-reduces when a replica is short of memory (notebook 02 shows when). Every number comes from the
planner's cost model (``decode.score``), on one node of ``n`` GPUs joined by ``link``. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..hardware import GPU, Link, gpu_cluster
from ..mesh import Layout
from ..models import ModelConfig
from ..units import ms
from .decode import score
from .memory import Workload, layout_problems


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


def _point(model, cluster, layout: Layout, label: str, workload: Workload) -> ServingPoint:
    problems = layout_problems(model, cluster, layout, workload)
    if problems:
        return ServingPoint(label, layout, problems[0])
    loaded = score(model, cluster, layout, workload)
    alone = score(model, cluster, layout, replace(workload, batch=1))
    return ServingPoint(label, layout, "", loaded.batch, loaded.decode_step_s, loaded.tokens_per_s,
                        alone.decode_step_s)


def latency_vs_throughput(model: ModelConfig, gpu: GPU, link: Link | None = None, degrees=(2, 4, 8),
                          workload: Workload = Workload()) -> tuple[ServingPoint, ...]:
    """One GPU alone, then for each ``n`` in ``degrees``: ``n`` replicas and one copy split ``tp = n`` ways,
    on one node of ``n`` ``gpu`` s joined by ``link`` (the GPU's own node link unless given). The batch
    is sized from free memory unless ``workload`` fixes it."""
    out = [_point(model, gpu_cluster(gpu, 1, 1), Layout(1, 1), "1 GPU", workload)]
    for n in degrees:
        cluster = gpu_cluster(gpu, 1, n, intra_link=link)
        out.append(_point(model, cluster, Layout(1, 1, n), f"{n} replicas", workload))
        out.append(_point(model, cluster, Layout(n, 1, 1), f"tp = {n}", workload))
    return tuple(out)


def format_latency_vs_throughput(points, model_name: str = "") -> str:
    """The points as a table: batch, latency (alone and loaded), tokens per second in all and per GPU."""
    lines = [f"{model_name}".strip(),
             f"{'':<12}{'GPUs':>5}{'batch':>7}{'ms/token alone':>16}{'ms/token loaded':>17}{'tokens/s':>11}"
             f"{'per GPU':>9}"]
    for p in points:
        if not p.feasible:
            lines.append(f"{p.label:<12}{p.n_gpus:>5}  not an option: {p.problem}")
            continue
        lines.append(f"{p.label:<12}{p.n_gpus:>5}{p.batch:>7}{ms(p.latency_alone_s):>16}{ms(p.latency_s):>17}"
                     f"{p.tokens_per_s:>11,.0f}{p.tokens_per_s_per_gpu:>9,.0f}")
    return "\n".join(line for line in lines if line)
