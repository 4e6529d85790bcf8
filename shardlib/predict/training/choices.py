"""The training planner's choices for real models, dense and MoE, beside published training layouts: rows a
notebook prints.

Dense: the Llama 3 paper (Grattafiori et al. 2024, arXiv 2407.21783, section 3.3.2, Table 4) trained
Llama 3.1 405B on H100 80GB GPUs (8 per server, NVLink inside, 400 Gb/s RoCE between) with tp = 8,
pp = 16 and FSDP on dp: 8,192 GPUs (dp 64) and 16,384 GPUs (dp 128) at 8,192 tokens per sequence, and
cp = 16 (dp 8) at 131,072 for long context, always 16M tokens a step, at 43, 41 and 38 % BF16 MFU. The
paper gives no layouts for 8B and 70B: their rows show the planner's choice alone.
MoE: DeepSeek-V3 (arXiv 2412.19437) trained on 2,048 H800 (NVLink 160 GB/s inside a node, InfiniBand
50 GB/s between) with pp = 16, ep = 64 over 8 nodes, ZeRO-1 and no tp (3.2), DualPipe overlapping each
microbatch's all-to-alls with another's compute (3.2.1), routing to at most 4 nodes (2.1.2), 15,360
sequences of 4K a step (4.2), 3.7 days per trillion tokens (1): about 3.1 M tokens/s, in FP8 (3.3), which
this package's time model does not price. Each published layout is scored under this package's model (its
best microbatch and recomputation that fit), and each row says where the choice differs and why. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import DP_STRATEGIES, Layout, Rejected
from shardlib.facts.hardware import GPU, H100_80GB, H800, Cluster, gpu_cluster
from shardlib.facts.models import DEEPSEEK_V3, LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.training.planner import best_configuration, plan_training
from shardlib.predict.training.time_model import TrainingScore, TrainingWorkload, ep_all_to_all_s
from shardlib.predict.units import seconds

SIXTEEN_M = 2048 * 8192  # "16M tokens" a step: 2,048 sequences of 8K, or 128 of 128K
LLAMA_MEMORY = ("Korthikanti's 34 s b h / t (a GELU MLP with dropout masks), not Llama's SwiGLU layer without "
                "dropout, and we keep 10 % for buffers")


@dataclass(frozen=True)
class PublishedLayout:
    """A published training layout: ``gpu`` (8 per node) laid out as ``layout``, scored with its data-parallel
    strategy (``dp_name``: as published), its sequence and global batch, what it reports (``mfu`` or
    ``tokens_per_s``; 0: not published), and what this package's per-layer memory count leaves out of it
    (``memory_note``)."""

    model: ModelConfig
    gpu: GPU
    layout: Layout
    sequence_tokens: int
    global_batch_tokens: int
    dp_name: str
    memory_note: str
    source: str
    mfu: float = 0.0  # Table 4's "BF16 MFU" as printed (400 TFLOPs over the H100's 989 read 40 %; it prints 41)
    tokens_per_s: float = 0.0

    @property
    def sequences(self) -> int:
        return self.global_batch_tokens // self.sequence_tokens

    @property
    def label(self) -> str:
        return f"{replace(self.layout, dp_strategy='ddp').label} {self.dp_name}"

    def cluster(self) -> Cluster:
        return gpu_cluster(self.gpu, self.layout.world_size // 8)

    def workload(self, **settings) -> TrainingWorkload:
        return TrainingWorkload(sequence_tokens=self.sequence_tokens, global_batch_tokens=self.global_batch_tokens,
                                **settings)


def _llama(cp: int, dp: int, seq: int, mfu: float) -> PublishedLayout:
    """Llama 3.1 405B as Table 4 prints it; FSDP as Llama 3 ran it (section 3.3.2: optimizer state and
    gradients sharded, the weights not resharded after the forward) is ZeRO-2 during a step."""
    return PublishedLayout(LLAMA_3_1_405B, H100_80GB, Layout(8, 16, dp, cp=cp, dp_strategy="zero2"), seq, SIXTEEN_M,
                           "FSDP as ZeRO-2", LLAMA_MEMORY, "Llama 3 paper, Table 4", mfu=mfu)


LLAMA_3_PUBLISHED = (_llama(1, 64, 8192, 0.43), _llama(1, 128, 8192, 0.41), _llama(16, 8, 131072, 0.38))
DEEPSEEK_V3_PUBLISHED = PublishedLayout(
    DEEPSEEK_V3, H800, Layout(1, 16, 128, ep=64, dp_strategy="zero1"), dp_name="ZeRO-1",
    sequence_tokens=4096, global_batch_tokens=15360 * 4096, tokens_per_s=1e12 / (3.7 * 86400),
    memory_note="Korthikanti's dense layer in BF16, while DeepSeek-V3 recomputes its norms and MLA up-projections, "
                "keeps some activations in FP8 and moves its EMA to the CPU (section 3.2.3)",
    source="DeepSeek-V3 report, sections 3.1-3.2 (layout), 4.2 (batch), 1 (3.7 days per trillion tokens)")
# Published cluster sizes without a published layout: one node for 8B, 8 and 16 nodes for 70B.
UNPUBLISHED = ((LLAMA_3_8B, 8), (LLAMA_3_70B, 64), (LLAMA_3_70B, 128))


@dataclass(frozen=True)
class ChoiceRow:
    """The planner's choice for ``model`` on ``gpus`` GPUs, the published layout (if any) and its score under the
    same model (or why it does not fit), and the differences in words. ``overlap``: the experts' all-to-alls
    under another microbatch's compute (DualPipe) rather than exposed."""

    model: str
    gpus: int
    sequence_tokens: int
    chosen: TrainingScore | None
    published: PublishedLayout | None
    published_score: TrainingScore | Rejected | None
    notes: tuple[str, ...]
    overlap: bool = False


def _memory_gap(pub: PublishedLayout, ours: TrainingScore, w: TrainingWorkload) -> str:
    """Why selective recomputation (Llama 3 trained its 8K sequences without activation checkpointing) does
    not fit the published layout here: the fullest stage's bytes against the usable bytes."""
    cluster = pub.cluster()
    mem = w.memory(pub.model, pub.layout, ours.microbatch, ours.n_microbatches, "selective")
    usable = w.usable_bytes(cluster)
    whole = "fits" if mem.total_bytes <= cluster.memory_per_gpu_bytes else "does not fit"
    return (f"the term that disagrees is memory: with selective recomputation stage {mem.stage} needs "
            f"{mem.total_bytes / 1e9:.1f} GB ({mem.layers} layers, {mem.activations_bytes / 1e9:.1f} GB of "
            f"activations for {mem.in_flight:g} microbatches in flight) against {usable / 1e9:.1f} GB usable, "
            f"{(mem.total_bytes - usable) / 1e9:.1f} GB over; it {whole} the whole "
            f"{cluster.memory_per_gpu_bytes / 1e9:.0f} GB. Our per-layer count is {pub.memory_note}")


def _published_notes(pub: PublishedLayout, ours: TrainingScore | Rejected, w: TrainingWorkload) -> list[str]:
    if isinstance(ours, Rejected):
        return [f"the published layout does not fit our memory model: {ours.reasons[0]}"]
    reported = f"{pub.mfu:.0%}" if pub.mfu else f"about {pub.tokens_per_s / 1e6:.1f} M tokens/s"
    out = [f"the published layout, {pub.dp_name}{' and lighter end stages' if w.lighter_ends else ''}: "
           f"{ours.recompute} recomputation at microbatch "
           f"{ours.microbatch} (x {ours.n_microbatches}), step {seconds(ours.step_s)} with a bubble of "
           f"{seconds(ours.bubble_s)}: {ours.tokens_per_s / 1e6:.2f} M tokens/s, MFU {ours.mfu:.0%} predicted "
           f"against {reported} published"]
    if ours.recompute == "full":
        out.append(_memory_gap(pub, ours, w))
    lay = pub.layout
    if lay.ep > 1:
        a2a = ep_all_to_all_s(pub.model, pub.cluster(), lay, w, ours.microbatch)
        layer = ours.compute_s / ours.n_microbatches / ours.memory.layers
        out.append(f"ep = {lay.ep} spans {lay.ep // 8} nodes: one dispatch of a microbatch's {w.sequence_tokens:,} "
                   f"tokens, each sent to at most {pub.model.node_limit} nodes, takes {a2a * 1e3:.1f} ms over "
                   f"InfiniBand, against {layer * 1e3:.1f} ms of one layer's compute (forward, backward, "
                   "recomputation) per microbatch: " + ("DualPipe hides it" if w.ep_overlap and ours.ep_s == 0 else
                                                        f"exposed, the all-to-alls cost {seconds(ours.ep_s)} a step"))
    return out


def _choice_notes(pub: PublishedLayout, best: TrainingScore | None, ours: TrainingScore | Rejected,
                  w: TrainingWorkload) -> list[str]:
    if best is None:
        return ["no layout fits"]
    lay, p = best.layout, pub.layout
    diff = [f"{a} {getattr(lay, a)} (published {getattr(p, a)})" for a in ("tp", "cp", "pp", "dp", "ep")
            if getattr(lay, a) != getattr(p, a)]
    if lay.dp_strategy != p.dp_strategy:
        diff.append(f"{lay.dp_strategy} (published {pub.dp_name})")
    out = [("the planner differs in " + ", ".join(diff) if diff else "the planner picks the published layout")
           + f", predicting {best.tokens_per_s / 1e6:.2f} M tokens/s, MFU {best.mfu:.0%}"]
    if lay.cp > p.cp:
        out.append(f"more cp: a {lay.cp}-way ring keeps 1/{lay.cp} of each sequence's activations per GPU, so "
                   f"selective recomputation fits; this model hides the ring's K/V ({pub.model.n_kv_heads} KV heads) "
                   f"behind the causal attention, so it costs {seconds(best.cp_s)} a step; slices stay at least "
                   f"{w.min_ring_slice_tokens:,} tokens")
    if lay.tp > p.tp:
        out.append(f"tp = {lay.tp}: its collectives cost {seconds(best.tp_s)} a step over {pub.gpu.name}'s NVLink and "
                   f"buy memory (the planner's memory model needs it); the published run used tp = {p.tp}")
    if p.ep > 1 and lay.ep == 1:
        out.append("ep = 1: the experts are split by tp like a dense MLP, so no all-to-all at all; the model does "
                   "not price the small matrices this leaves (each expert's MLP cut tp ways)")
    elif lay.ep != p.ep:
        out.append(f"ep = {lay.ep}: each rank holds {pub.model.n_experts // lay.ep} of the {pub.model.n_experts} "
                   f"experts of each layer; the all-to-alls cost {seconds(best.ep_s)} a step"
                   + (" under DualPipe's overlap" if w.ep_overlap else " exposed"))
    if lay.pp < p.pp and not isinstance(ours, Rejected):
        out.append(f"fewer stages: pp = {lay.pp} has a bubble of {seconds(best.bubble_s)} against "
                   f"{seconds(ours.bubble_s)} at pp = {p.pp} with {w.sequences:,} sequences over dp = {p.dp}")
    return out


def beside_published(pub: PublishedLayout, w: TrainingWorkload) -> ChoiceRow:
    """The planner on ``pub``'s cluster and workload ``w``, beside ``pub`` scored the same way."""
    plan = plan_training(pub.model, pub.cluster(), w)
    ours = best_configuration(pub.model, pub.cluster(), pub.layout, w)
    notes = plan.reasons[:1] + tuple(_published_notes(pub, ours, w) + _choice_notes(pub, plan.best, ours, w))
    return ChoiceRow(pub.model.name, pub.layout.world_size, w.sequence_tokens, plan.best, pub, ours, notes,
                     w.ep_overlap)


def training_choices(kernel_efficiency: float = 0.5, schedule: str = "1f1b", chunks: int = 2) -> list[ChoiceRow]:
    """The planner on each published configuration (Llama 3.1 405B) and on published cluster sizes for 8B and
    70B (at 8K tokens, 16M a step), each beside the published layout where there is one; every row with
    Llama 3's lighter end stages (one layer fewer on the first and the last)."""
    settings = {"kernel_efficiency": kernel_efficiency, "schedule": schedule, "chunks": chunks, "lighter_ends": True}
    rows = [beside_published(pub, pub.workload(**settings)) for pub in LLAMA_3_PUBLISHED]
    for model, gpus in UNPUBLISHED:
        w = TrainingWorkload(**settings)
        p = plan_training(model, gpu_cluster(H100_80GB, gpus // 8), w)
        rows.append(ChoiceRow(model.name, gpus, w.sequence_tokens, p.best, None, None,
                              p.reasons[:2] + (p.best.reasons if p.best else ())))
    return rows


@lru_cache(maxsize=8)
def deepseek_v3_choices(kernel_efficiency: float = 0.5, pub: PublishedLayout = DEEPSEEK_V3_PUBLISHED,
                        dp_strategies: tuple[str, ...] = DP_STRATEGIES) -> tuple[ChoiceRow, ...]:
    """The planner on DeepSeek-V3's cluster and batch, with the all-to-alls exposed and under DualPipe's overlap,
    each beside the published layout scored the same way, with the reasons they differ. ``dp_strategies``: the
    data-parallel strategies searched (all four take about 4 s; ``("zero1",)``, the published one, about half).
    Computed once per argument set (the result is a pure function of them)."""
    return tuple(beside_published(pub, pub.workload(kernel_efficiency=kernel_efficiency, ep_overlap=overlap,
                                                    dp_strategies=dp_strategies)) for overlap in (False, True))
