"""What one GPU of a training layout keeps: weights, gradients, optimizer state and activations, per stage.

Parameters per GPU of stage ``i``: ``shapes.stage_params_per_device`` (the serving planner's too), with
``ep > 1`` its ``n_experts / ep`` whole experts (``check_expert_layout``). Bytes per parameter:
``STATE_BYTES_MEGATRON`` (2 + 4 + 12) or ``STATE_BYTES_MIXED`` (ZeRO, Rajbhandari et al. 2020: 2 + 2 + 12),
sharded by ``dp_strategy`` over ``dp x cp`` ranks (the experts' over ``expert_dp``). Activations:
``layer_activation_bytes`` (Korthikanti et al. 2022, Table 2) per layer, for ``seq / cp`` tokens, times the
microbatches in flight (1F1B's stage ``i`` of ``p``: ``min(p - i, m)``); the first stage adds the
embedding's dropout mask, the last its head input and fp32 logits. ZeRO-3 adds two layers gathered whole;
other transients are the planner's margin (``memory_utilization``). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from shardlib.core.checks import choice, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.registry import schedule_spec
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.predict.data_parallel import STATE_BYTES_MEGATRON, layer_activation_bytes, memory_per_rank
from shardlib.predict.shapes import padded_vocab_size, stage_params_per_device

MEGATRON_SCHEDULES = ("1f1b", "interleaved-1f1b")  # the registry's schedules this model covers: Megatron-LM's two


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes on one GPU of ``stage``: states kept between steps, activations kept for the backward at the
    in-flight peak (``in_flight`` microbatches), and the stage's embedding/head activations."""

    stage: int
    layers: int
    params: float
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    ends_bytes: float  # embedding dropout mask (first stage), head input and fp32 logits (last stage)
    in_flight: float
    gathered_bytes: float = 0.0  # ZeRO-3: two layers' whole weights and gradients (one working, one prefetched)
    expert_params: float = 0.0  # of ``params``, the experts' (ep > 1: kept by the expert-data-parallel group)

    @property
    def states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> float:
        return self.states_bytes + self.activations_bytes + self.ends_bytes + self.gathered_bytes


def check_expert_layout(model: ModelConfig, layout: Layout) -> None:
    """A ValueError in the learner's terms when ``layout.ep`` cannot spread ``model``'s experts: a dense
    model, an ep that does not divide the experts, or one that does not divide a stage's ranks."""
    ep = layout.ep
    if ep == 1:
        return
    if not model.is_moe:
        raise ValueError(f"ep = {ep}: {model.name} is dense (n_experts = 1), it has no experts to spread")
    if model.n_experts % ep:
        raise ValueError(f"ep = {ep} does not divide the {model.n_experts} experts of {model.name}: each rank holds "
                         f"whole experts ({model.n_experts} / {ep} = {model.n_experts / ep:.3g}); use an ep that "
                         f"divides {model.n_experts}")
    per_stage = layout.tp * layout.dp * layout.cp
    if per_stage % ep:
        raise ValueError(f"ep = {ep} must divide the tp x dp x cp = {layout.tp} x {layout.dp} x {layout.cp} = "
                         f"{per_stage} ranks of a stage: the experts are spread over ranks of one stage")


def expert_dp(layout: Layout) -> int:
    """Ranks of a stage keeping the same experts when ``ep > 1``: ``tp x dp x cp / ep`` (expert data
    parallelism); with ``ep = 1`` the experts are split by tp and kept by the ``dp x cp`` ranks."""
    return layout.tp * layout.dp * layout.cp // layout.ep if layout.ep > 1 else layout.dp * layout.cp


def stage_params(model: ModelConfig, layout: Layout, stage: int, lighter_ends: bool = False) -> float:
    """Parameters one GPU of ``stage`` holds (``shapes.stage_params_per_device``, the serving planner's too)."""
    check_expert_layout(model, layout)
    return sum(stage_params_per_device(model, layout.tp, layout.pp, stage, layout.ep, lighter_ends))


def in_flight(stage: int, pp: int, n_microbatches: int, schedule: str = "1f1b", chunks: int = 2) -> float:
    """Microbatches whose activations ``stage`` keeps at its peak: 1F1B's ``p - i`` (at most ``m``);
    interleaved with ``v`` chunks ``p - i + (p - 1) / v`` (Narayanan et al. 2021; Korthikanti et al. 2022,
    4.2.3)."""
    choice(schedule, MEGATRON_SCHEDULES, "schedule")
    m = whole_number(n_microbatches, "n_microbatches")
    v = schedule_spec(schedule).n_chunks(whole_number(chunks, "chunks"))
    if v == 1 or pp == 1:
        return min(pp - stage, m)
    return min(pp - stage + (pp - 1) / v, m)


def training_memory(model: ModelConfig, layout: Layout, seq: int, microbatch: int, n_microbatches: int,
                    recompute: str = "selective", sequence_parallel: bool = True, stage: int = 0,
                    state_bytes: Mapping[str, float] = STATE_BYTES_MEGATRON, schedule: str = "1f1b",
                    chunks: int = 2, lighter_ends: bool = False) -> TrainingMemory:
    """Bytes on one GPU of ``stage`` of ``layout`` training ``model`` (the module docstring's rules)."""
    seq, b = whole_number(seq, "seq"), whole_number(microbatch, "microbatch")
    if seq % layout.cp:
        raise ValueError(f"a sequence of {seq} tokens cannot be split into {layout.cp} equal ring slices (cp)")
    if not 0 <= stage < layout.pp:
        raise ValueError(f"stage {stage} is not one of the {layout.pp} stages (0 to {layout.pp - 1})")
    sp = sequence_parallel and layout.tp > 1
    layers = stage_layer_counts(model.n_layers, layout.pp, end_layers=int(lighter_ends))[stage]
    params = stage_params(model, layout, stage, lighter_ends)
    # ep > 1: n_experts / ep whole experts per layer, kept by the expert-data-parallel ranks (ep = 1: split by tp)
    experts = layers * model.n_experts // layout.ep * model.expert_params if layout.ep > 1 else 0.0
    states = memory_per_rank(params - experts, layout.dp_strategy, layout.dp * layout.cp, state_bytes)
    if experts:
        kept = memory_per_rank(experts, layout.dp_strategy, expert_dp(layout), state_bytes)
        states = {key: states[key] + kept[key] for key in states}
    tokens = seq // layout.cp
    held = in_flight(stage, layout.pp, n_microbatches, schedule, chunks)
    activations = layers * layer_activation_bytes(model, tokens, b, recompute, layout.tp, sp) * held
    t, sbh = layout.tp, tokens * b * model.d_model
    ends = 0.0
    if stage == 0:
        ends += sbh / (t if sp else 1) * held  # the embedding's dropout mask, 1 byte a value
    if stage == layout.pp - 1:
        v = padded_vocab_size(model, t)
        ends += 4 * sbh / t * (1 + v / model.d_model)  # norm and head inputs, fp32 logits: one microbatch
    gathered = 0.0
    if layout.dp_strategy == "zero3" and layout.dp * layout.cp > 1:
        gathered = 2 * params / layers * (state_bytes["params"] + state_bytes["grads"])
    return TrainingMemory(stage, layers, params, states["params"], states["grads"], states["optimizer"],
                          activations, ends, held, gathered, experts)


def peak_training_memory(model: ModelConfig, layout: Layout, seq: int, microbatch: int, n_microbatches: int,
                         **kwargs) -> TrainingMemory:
    """The fullest of the first, second and last stage (the middle ones never exceed the second)."""
    stages = {0, min(1, layout.pp - 1), layout.pp - 1}
    return max((training_memory(model, layout, seq, microbatch, n_microbatches, stage=s, **kwargs) for s in stages),
               key=lambda m: m.total_bytes)
