"""The training planner on DeepSeek-V3, beside its published training layout: rows and reasons a notebook prints.

Published (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437): 2,048 H800 GPUs, 8 per node,
NVLink inside a node (160 GB/s) and InfiniBand between (50 GB/s) (section 3.1, 3.2.2); "16-way Pipeline
Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1 Data Parallelism (DP)", no
tensor parallelism (section 3.2), DualPipe overlapping each microbatch's all-to-alls with another's compute
(3.2.1), node-limited routing to 4 nodes (2.1.2); sequences of 4K tokens, a batch of 15,360 sequences once
ramped up (4.2); 180K H800 GPU hours per trillion tokens, "3.7 days on our cluster" (section 1): about
3.1 million tokens a second. Its matrices multiply in FP8 (3.3), which this package's time model does not
price (BF16 peak).

``deepseek_v3_choices`` runs ``plan_training`` twice, with the all-to-alls exposed and with DualPipe's overlap
(``TrainingWorkload(ep_overlap=True)``), scores the published layout under the same model each time, and
says in words where the planner's choice differs and why. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import DP_STRATEGIES, Layout, Rejected
from shardlib.facts.hardware import H800, Cluster, gpu_cluster
from shardlib.facts.models import DEEPSEEK_V3
from shardlib.predict.training.memory import peak_training_memory
from shardlib.predict.training.planner import best_configuration, plan_training, seconds
from shardlib.predict.training.time_model import TrainingScore, TrainingWorkload, ep_all_to_all_s

GIGA = 1e9


@dataclass(frozen=True)
class PublishedMoELayout:
    """A published MoE training layout: ``gpus`` GPUs as tp x pp x dp with experts over ``ep`` ranks, its
    data-parallel strategy, sequence and batch, and the throughput it reports."""

    model: ModelConfig
    gpus: int
    tp: int
    pp: int
    dp: int
    ep: int
    dp_strategy: str
    sequence_tokens: int
    sequences: int
    tokens_per_s: float
    source: str

    def layout(self) -> Layout:
        return Layout(self.tp, self.pp, self.dp, ep=self.ep, dp_strategy=self.dp_strategy)

    def cluster(self) -> Cluster:
        return gpu_cluster(H800, self.gpus // 8)

    def workload(self, kernel_efficiency: float = 0.5, ep_overlap: bool = False) -> TrainingWorkload:
        return TrainingWorkload(sequence_tokens=self.sequence_tokens,
                                global_batch_tokens=self.sequences * self.sequence_tokens,
                                kernel_efficiency=kernel_efficiency, ep_overlap=ep_overlap)


DEEPSEEK_V3_PUBLISHED = PublishedMoELayout(
    DEEPSEEK_V3, 2048, tp=1, pp=16, dp=128, ep=64, dp_strategy="zero1", sequence_tokens=4096, sequences=15360,
    tokens_per_s=1e12 / (3.7 * 86400),
    source="DeepSeek-V3 report, sections 3.1-3.2 (layout), 4.2 (batch), 1 (3.7 days per trillion tokens)")


@dataclass(frozen=True)
class MoEChoiceRow:
    """One run of the planner (``overlap``: the all-to-alls under compute or exposed): its choice, the
    published layout scored by the same model (or why it does not fit), and the differences in words."""

    overlap: bool
    chosen: TrainingScore | None
    published: TrainingScore | Rejected
    reasons: tuple[str, ...]


def _published_reasons(pub: PublishedMoELayout, ours: TrainingScore | Rejected, w: TrainingWorkload) -> list[str]:
    if isinstance(ours, Rejected):
        return [f"the published layout does not fit this memory model: {ours.reasons[0]}"]
    lay, cluster = pub.layout(), pub.cluster()
    out = [f"the published layout {lay.label} scores {ours.tokens_per_s / 1e6:.2f} M tokens/s (MFU {ours.mfu:.0%}) "
           f"with {ours.recompute} recomputation at microbatch {ours.microbatch} x {ours.n_microbatches}, against "
           f"about {pub.tokens_per_s / 1e6:.1f} M published (in FP8, which this model does not price)"]
    if ours.recompute == "full":
        mem = peak_training_memory(pub.model, lay, w.sequence_tokens, ours.microbatch, ours.n_microbatches,
                                   recompute="selective", sequence_parallel=w.sequence_parallel,
                                   state_bytes=w.state_bytes)
        out.append(f"memory disagrees: with selective recomputation stage {mem.stage} needs "
                   f"{mem.total_bytes / GIGA:.1f} GB ({mem.activations_bytes / GIGA:.1f} GB of activations for "
                   f"{mem.in_flight:g} microbatches in flight) against {w.usable_bytes(cluster) / GIGA:.1f} GB "
                   "usable; our per-layer count is "
                   "Korthikanti's dense layer in BF16, while DeepSeek-V3 recomputes its norms and MLA up-projections, "
                   "keeps some activations in FP8 and moves its EMA to the CPU (section 3.2.3)")
    a2a = ep_all_to_all_s(pub.model, cluster, lay, w, ours.microbatch)
    layer = ours.compute_s / ours.n_microbatches / ours.memory.layers
    out.append(f"ep = {lay.ep} spans {lay.ep // 8} nodes: one dispatch of a microbatch's {w.sequence_tokens:,} tokens, "
               f"each sent to at most {pub.model.node_limit} nodes, takes {a2a * 1e3:.1f} ms over InfiniBand, against "
               f"{layer * 1e3:.1f} ms of one layer's compute (forward, backward, recomputation) per microbatch: "
               + ("DualPipe hides it" if w.ep_overlap and ours.ep_s == 0 else
                  f"exposed, the all-to-alls cost {seconds(ours.ep_s)} a step"))
    return out


def _choice_reasons(pub: PublishedMoELayout, best: TrainingScore | None, ours: TrainingScore | Rejected,
                    w: TrainingWorkload) -> list[str]:
    if best is None:
        return ["no layout fits"]
    lay, out = best.layout, []
    diff = [f"{a} {getattr(lay, a)} (published {getattr(pub, a)})" for a in ("tp", "pp", "dp", "ep")
            if getattr(lay, a) != getattr(pub, a)]
    if lay.dp_strategy != pub.dp_strategy:
        diff.append(f"{lay.dp_strategy} (published {pub.dp_strategy})")
    out.append(("the planner differs in " + ", ".join(diff) if diff else "the planner picks the published layout")
               + f": {best.tokens_per_s / 1e6:.2f} M tokens/s predicted, MFU {best.mfu:.0%}")
    if lay.tp > pub.tp:
        out.append(f"tp = {lay.tp}: its collectives cost {seconds(best.tp_s)} a step over H800's NVLink (160 GB/s) "
                   "and buy memory (the planner's memory model needs it); DeepSeek-V3 saved memory elsewhere instead "
                   "and used no tensor parallelism")
    if lay.ep == 1:
        out.append("ep = 1: the experts are split by tp like a dense MLP, so no all-to-all at all; the model does "
                   "not price the small matrices this leaves (each expert's 2,048-wide MLP cut tp ways)")
    elif lay.ep != pub.ep:
        out.append(f"ep = {lay.ep}: each rank holds {pub.model.n_experts // lay.ep} of the {pub.model.n_experts} "
                   f"experts of each layer; the all-to-alls cost {seconds(best.ep_s)} a step exposed"
                   + (" (under DualPipe's overlap)" if w.ep_overlap else ""))
    if lay.pp < pub.pp and not isinstance(ours, Rejected):
        out.append(f"fewer stages: pp = {lay.pp} has a bubble of {seconds(best.bubble_s)} against "
                   f"{seconds(ours.bubble_s)} at pp = {pub.pp} (1F1B's (p - 1)/(m + p - 1); DualPipe's is smaller)")
    return out


def deepseek_v3_choices(kernel_efficiency: float = 0.5, pub: PublishedMoELayout = DEEPSEEK_V3_PUBLISHED,
                        dp_strategies: tuple[str, ...] = DP_STRATEGIES) -> list[MoEChoiceRow]:
    """The planner on DeepSeek-V3's cluster and batch, with the all-to-alls exposed and under DualPipe's overlap,
    each beside the published layout scored the same way, with the reasons they differ. ``dp_strategies``: the
    data-parallel strategies searched (all four take about 4 s; ``("zero1",)``, the published one, about half).
    Computed once per argument set (the result is a pure function of them)."""
    return list(_choices(kernel_efficiency, pub, tuple(dp_strategies)))


@lru_cache(maxsize=8)
def _choices(kernel_efficiency: float, pub: PublishedMoELayout, dp_strategies: tuple[str, ...]
             ) -> tuple[MoEChoiceRow, ...]:
    rows = []
    for overlap in (False, True):
        w = replace(pub.workload(kernel_efficiency, overlap), dp_strategies=dp_strategies)
        plan = plan_training(pub.model, pub.cluster(), w)
        ours = best_configuration(pub.model, pub.cluster(), pub.layout(), w)
        rows.append(MoEChoiceRow(overlap, plan.best, ours,
                                 tuple(_choice_reasons(pub, plan.best, ours, w) + _published_reasons(pub, ours, w))))
    return tuple(rows)
