"""The training planner's choices for real models beside published training layouts: rows a notebook prints.

Published: the Llama 3 paper (Grattafiori et al. 2024, arXiv 2407.21783, section 3.3.2, Table 4) trained
Llama 3.1 405B on H100 80GB GPUs (8 per server, NVLink inside, 400 Gb/s RoCE between) with tp = 8,
pp = 16 and FSDP on dp: 8,192 GPUs (dp 64) and 16,384 GPUs (dp 128) at 8,192 tokens per sequence, and
cp = 16 (dp 8) at 131,072 for long context, always 16M tokens a step, reaching 430, 400 and 380 BF16
TFLOPs per GPU. The paper gives no layouts for 8B and 70B: their rows show the planner's choice alone.
Each row with a published layout also scores that layout under this package's model (its best
microbatch and recomputation that fit) and says where the choice differs and why. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout, Rejected
from shardlib.facts.hardware import H100_80GB, gpu_cluster
from shardlib.facts.models import LLAMA_3_1_405B, LLAMA_3_8B, LLAMA_3_70B
from shardlib.predict.training.memory import peak_training_memory
from shardlib.predict.training.planner import TrainingPlan, best_configuration, plan_training, seconds
from shardlib.predict.training.time_model import TrainingScore, TrainingWorkload

SIXTEEN_M = 2048 * 8192  # "16M tokens" a step: 2,048 sequences of 8K, or 128 of 128K


@dataclass(frozen=True)
class PublishedLayout:
    """A published training layout: ``gpus`` H100s as tp x cp x pp x dp, its sequence and global batch, and
    the BF16 TFLOPs per GPU reported."""

    model: ModelConfig
    gpus: int
    tp: int
    cp: int
    pp: int
    dp: int
    sequence_tokens: int
    global_batch_tokens: int
    tflops_per_gpu: float
    published_mfu: float  # Table 4's "BF16 MFU" column, as printed
    source: str = "Llama 3 paper, Table 4"

    def layout(self, dp_strategy: str = "zero2") -> Layout:
        """The published layout; FSDP as Llama 3 ran it (section 3.3.2: optimizer state and gradients
        sharded, the weights not resharded after the forward) is ZeRO-2 during a step."""
        return Layout(self.tp, self.pp, self.dp, cp=self.cp, dp_strategy=dp_strategy)

    @property
    def mfu(self) -> float:
        """The MFU Table 4 prints (38 to 43 %; 400 TFLOPs over the H100's 989 would read 40 %, the paper
        prints 41 %)."""
        return self.published_mfu


LLAMA_3_PUBLISHED = (
    PublishedLayout(LLAMA_3_1_405B, 8192, 8, 1, 16, 64, 8192, SIXTEEN_M, 430, 0.43),
    PublishedLayout(LLAMA_3_1_405B, 16384, 8, 1, 16, 128, 8192, SIXTEEN_M, 400, 0.41),
    PublishedLayout(LLAMA_3_1_405B, 16384, 8, 16, 16, 8, 131072, SIXTEEN_M, 380, 0.38),
)
# Published cluster sizes without a published layout: one node for 8B, 8 and 16 nodes for 70B.
UNPUBLISHED = ((LLAMA_3_8B, 8), (LLAMA_3_70B, 64), (LLAMA_3_70B, 128))


@dataclass(frozen=True)
class ChoiceRow:
    """The planner's choice for ``model`` on ``gpus`` GPUs, the published layout (if any) scored by the same
    model, and the differences in words."""

    model: str
    gpus: int
    sequence_tokens: int
    chosen: TrainingScore | None
    published: PublishedLayout | None
    published_score: TrainingScore | Rejected | None
    notes: tuple[str, ...]


def _score_published(pub: PublishedLayout, workload: TrainingWorkload) -> TrainingScore | Rejected:
    """The published layout under our model as published: FSDP as ZeRO-2 (``PublishedLayout.layout``), the
    end stages lighter by a layer (the workload's ``lighter_ends``); the best microbatch and recomputation
    that fit."""
    return best_configuration(pub.model, gpu_cluster(H100_80GB, pub.gpus // 8), pub.layout(), workload)


def _selective_gap(pub: PublishedLayout, ours: TrainingScore, workload: TrainingWorkload) -> str:
    """Why selective recomputation (Llama 3's run: no activation checkpointing, FlashAttention keeping no
    scores) does not fit the published layout here: the fullest stage's bytes against the usable bytes."""
    cluster = gpu_cluster(H100_80GB, pub.gpus // 8)
    w = workload
    mem = peak_training_memory(pub.model, pub.layout(), w.sequence_tokens, ours.microbatch, ours.n_microbatches,
                               recompute="selective", sequence_parallel=w.sequence_parallel,
                               state_bytes=w.state_bytes, schedule=w.schedule, chunks=w.chunks,
                               lighter_ends=w.lighter_ends)
    usable = w.usable_bytes(cluster)
    whole = "fits" if mem.total_bytes <= cluster.memory_per_gpu_bytes else "does not fit"
    ran = ""
    if w.sequence_tokens <= 8192:
        ran = " (Llama 3 trained its 8K sequences without activation checkpointing)"
    return (f"the term that disagrees is memory: without recomputing{ran} stage {mem.stage} needs "
            f"{mem.total_bytes / 1e9:.1f} GB ({mem.layers} layers, "
            f"{mem.in_flight:g} microbatches in flight) against {usable / 1e9:.1f} GB usable, "
            f"{(mem.total_bytes - usable) / 1e9:.1f} GB over; it {whole} the whole 80 GB. Our per-layer count is "
            "Korthikanti's 34 s b h / t (a GELU MLP with dropout masks), not Llama's SwiGLU layer without dropout, "
            "and we keep 10 % for buffers")


def _differences(best: TrainingScore | None, pub: PublishedLayout, ours: TrainingScore | Rejected,
                 workload: TrainingWorkload) -> tuple[str, ...]:
    out = []
    if isinstance(ours, Rejected):
        out.append(f"the published layout does not fit our memory model: {ours.reasons[0]}")
    else:
        out.append(f"the published layout, FSDP as ZeRO-2 and lighter end stages: {ours.recompute} recomputation "
                   f"at microbatch {ours.microbatch} (x {ours.n_microbatches}), step {seconds(ours.step_s)} with a "
                   f"bubble of {seconds(ours.bubble_s)}: MFU {ours.mfu:.0%} predicted against {pub.mfu:.0%} published")
        if ours.recompute == "full":
            out.append(_selective_gap(pub, ours, workload))
    if best is None:
        return tuple(out)
    lay = best.layout
    diff = [f"{a} {getattr(lay, a)} (published {getattr(pub, a)})" for a in ("tp", "cp", "pp", "dp")
            if getattr(lay, a) != getattr(pub, a)]
    if diff:
        out.append("the planner differs in " + ", ".join(diff) + f", predicting MFU {best.mfu:.0%}")
    else:
        out.append(f"the planner picks the published layout's axes, predicting MFU {best.mfu:.0%}")
    if lay.cp > pub.cp:
        out.append(f"more cp: a {lay.cp}-way ring keeps 1/{lay.cp} of each sequence's activations per GPU, so "
                   "selective recomputation fits; "
                   f"this model hides the ring's K/V (8 KV heads) behind the causal attention, so it costs "
                   f"{seconds(best.cp_s)} a step; slices stay at least {workload.min_ring_slice_tokens:,} tokens")
    if lay.pp < pub.pp:
        out.append(f"fewer stages: with {workload.sequences:,} sequences a step over dp {pub.dp}, each pipeline gets "
                   f"{workload.sequences // pub.dp} microbatches and the bubble ((p - 1)/(v m)) is large")
    return tuple(out)


def training_choices(kernel_efficiency: float = 0.5, schedule: str = "1f1b", chunks: int = 2) -> list[ChoiceRow]:
    """The planner on each published configuration (Llama 3.1 405B) and on published cluster sizes for 8B and
    70B (at 8K tokens, 16M a step), each beside the published layout where there is one; every row with
    Llama 3's lighter end stages (one layer fewer on the first and the last)."""
    rows = []
    for pub in LLAMA_3_PUBLISHED:
        w = TrainingWorkload(sequence_tokens=pub.sequence_tokens, global_batch_tokens=pub.global_batch_tokens,
                             kernel_efficiency=kernel_efficiency, schedule=schedule, chunks=chunks, lighter_ends=True)
        p = plan_training(pub.model, gpu_cluster(H100_80GB, pub.gpus // 8), w)
        ours = _score_published(pub, w)
        rows.append(ChoiceRow(pub.model.name, pub.gpus, w.sequence_tokens, p.best, pub, ours,
                              p.reasons[:1] + _differences(p.best, pub, ours, w)))
    for model, gpus in UNPUBLISHED:
        w = TrainingWorkload(kernel_efficiency=kernel_efficiency, schedule=schedule, chunks=chunks, lighter_ends=True)
        p: TrainingPlan = plan_training(model, gpu_cluster(H100_80GB, gpus // 8), w)
        rows.append(ChoiceRow(model.name, gpus, w.sequence_tokens, p.best, None, None,
                              p.reasons[:2] + (p.best.reasons if p.best else ())))
    return rows
