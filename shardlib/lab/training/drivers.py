"""The training step on a pool: every layout checked before any rank starts, run, gathered and compared.

* ``check_training``: every rule a layout must meet for the toy language model, in the learner's terms.
* ``run_training``: ``ranks.training_on_rank`` on every rank of a warm pool (``lab.harness.on_ranks``),
  read as a ``TrainingRun``: the global loss of every step, the full weights (keyed like
  ``reference.init_weights``), each rank's comm records of the steps, spans and ledger;
  ``against_reference``, ``traffic_by_axis`` and ``traffic_mismatches`` set them beside the reference and
  the predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from shardlib.core.mesh import Layout, check_mesh
from shardlib.core.pipeline.orders import make_schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.tensor_parallel.layers import ROW_PARALLEL
from shardlib.core.training.config import TrainingConfig
from shardlib.core.training.reference import TrainingReference
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.training.ranks import training_on_rank
from shardlib.predict.shapes import tensor_parallel_problems
from shardlib.predict.training.ledger import predict_ledger, predict_traffic
from shardlib.predict.training.memory import check_expert_layout


def check_training(layout: Layout, config: TrainingConfig, stage_counts=None) -> tuple[range, ...]:
    """A ValueError naming the numbers for any layout or schedule the step cannot run; the layers of each
    virtual stage (of each stage, with one chunk per rank), in virtual-stage order. ``stage_counts``: how many
    layers each takes (``None``: as even as whole layers allow)."""
    if not isinstance(layout, Layout) or not isinstance(config, TrainingConfig):
        raise ValueError("give a mesh.Layout and a training.corpus.TrainingConfig")
    check_expert_layout(config.model, layout)
    if config.is_moe:
        check_experts(layout, config)
    problems = tensor_parallel_problems(config.model, layout.tp, copy_kv_heads=False)
    if config.vocab_size % layout.tp:  # the toy's vocabulary is not padded
        problems.append(f"a vocabulary of {config.vocab_size} does not split evenly over tp = {layout.tp} ranks")
    if problems:
        raise ValueError("; ".join(problems))
    pieces = layout.cp * layout.tp * (2 if layout.cp > 1 else 1)
    if config.seq % pieces:
        how = f"2 x cp x tp = 2 x {layout.cp} x {layout.tp}" if layout.cp > 1 else f"tp = {layout.tp}"
        raise ValueError(f"a sequence of {config.seq} tokens does not split into {how} = {pieces} equal pieces "
                         "(zigzag gives each ring place two chunks; sequence parallelism cuts each place's "
                         "tokens tp ways)" if layout.cp > 1 else f"a sequence of {config.seq} tokens does not "
                         f"split into {how} equal pieces for sequence parallelism")
    try:
        schedule = make_schedule(config.schedule, layout.pp, config.m, n_chunks=config.chunks)
    except ValueError as e:
        raise ValueError(f"the schedule {config.schedule!r} cannot run on pp = {layout.pp} stages with m = {config.m} "
                         f"microbatches and {config.chunks} chunk(s) per rank: {e}") from None
    v = schedule.n_virtual_stages
    if v > config.n_layers:
        cut = f"{layout.pp} pipeline stages" + (f" x {schedule.n_chunks} chunks" if schedule.n_chunks > 1 else "")
        raise ValueError(f"{config.n_layers} layers cannot fill {cut} = {v} slices: each needs a layer")
    if layout.dp_strategy == "zero3" and layout.pp > 1:
        raise ValueError(f"ZeRO-3 runs here with pp = 1 only (got pp = {layout.pp}): its per-layer gathers "
                         "and the pipeline's interleaved microbatches are not combined in this step")
    if layout.dp_strategy == "zero3" and (schedule.n_chunks > 1 or schedule.split_backward):
        raise ValueError(f"ZeRO-3 runs here on one model chunk with a whole backward, and {schedule.title} has "
                         f"{schedule.n_chunks} chunk(s) per rank" + (" and a split backward (its W would find "
                         "each layer's gathered weights freed)" if schedule.split_backward else "")
                         + ": use '1f1b' or 'gpipe'")
    return split_layers(config.n_layers, v, stage_counts)


def check_experts(layout: Layout, config: TrainingConfig) -> None:
    """The rules experts add to ``check_expert_layout``'s (whole experts per rank, ep inside a stage), in the
    learner's terms: no ring, no ZeRO-3."""
    if layout.cp > 1:
        raise ValueError(f"experts with a context-parallel ring (cp = {layout.cp}) are not combined in this step: "
                         "use cp = 1")
    if layout.dp_strategy == "zero3":
        raise ValueError("experts with ZeRO-3 are not combined in this step: use ddp, zero1 or zero2")


def reference_key(name: str) -> tuple[str, int | str | None]:
    """A stage model's parameter name -> (the reference's key, the dim tp splits it along; ``None``: whole on
    every rank, a router; ``"ep"``: a block of experts, by place in the ep group)."""
    if ".moe." in name:
        layer, _, part, short = name.split(".")[:4]
        key = f"layers.{layer[len('layer'):]}."
        return (key + "router", None) if part == "router" else (key + short, "ep")
    if name.startswith("embed."):
        return "embed", 0
    if name.startswith("head."):
        return "head", 0
    layer, _, short = name.split(".")[:3]
    return f"layers.{layer[len('layer'):]}.{short}", 1 if short in ROW_PARALLEL else 0


def traffic_per_step(records, steps: int) -> dict:
    """(axis, op) -> (calls, buffer bytes, wire bytes) per step, from one rank's records of ``steps`` steps."""
    out: dict = {}
    for r in records:
        row = out.setdefault((r.group, r.op), [0, 0, 0])
        row[0] += 1
        row[1] += r.size_bytes
        row[2] += r.wire_bytes
    return {k: tuple(v // steps for v in row) for k, row in sorted(out.items())}


def step_records(got: Measured) -> tuple:
    """The comm records each rank issued inside its ``"step"`` spans (a pool's ``on_ranks``, or one rank's
    log under torchrun read as ``Measured((), comm=..., timeline=...)``)."""
    return tuple(r for s in got.spans(repeat=None) if s.kind == "step" for r in got.within(s))


def full_weights(got, layout: Layout) -> dict:
    """The full weights, keyed like ``reference.init_weights``, from the ranks' shards: each tp slice from
    replica 0 at ring place 0, each router from tp rank 0 there, each block of experts from the rank at its
    place of its stage's first ep group."""
    pieces: dict = {}
    per_stage = layout.tp * layout.dp * layout.cp
    first_ep = {r for g in layout.ep_groups() if g[0] % per_stage == 0 for r in g}
    for rank, value in zip(got.ranks, got.values):
        position = value["position"]
        for name, t in value["shards"].items():
            key, dim = reference_key(name)
            if position[1:3] == (0, 0) and isinstance(dim, int):
                pieces.setdefault(key, {})[position[3]] = (t, dim)
            elif position[1:] == (0, 0, 0) and dim is None:  # a router, whole on every rank
                pieces.setdefault(key, {})[0] = (t, 0)
            elif dim == "ep" and rank in first_ep:
                pieces.setdefault(key, {})[value["ep_place"]] = (t, 0)
    return {k: torch.cat([p[i][0] for i in sorted(p)], dim=p[0][1]) for k, p in pieces.items()}


@dataclass(frozen=True)
class TrainingRun:
    """The toy language model trained on ``layout`` (``got``: what ``on_ranks`` gathered from
    ``ranks.training_on_rank``), read as the notebooks read it."""

    layout: Layout
    config: TrainingConfig
    got: Measured
    stage_layers: tuple  # the layers of each virtual stage

    positions = property(lambda self: self.got.each("position"))  # per rank: (stage, replica, cp_rank, tp_rank)
    ledgers = property(lambda self: self.got.each("ledger"))  # per rank: bytes kept, activations' and transient peak
    activation_bytes = property(lambda self: self.got.each("activation_bytes"))  # per rank, per microbatch (chunk)
    spans = property(lambda self: self.got.timeline)  # every rank's timeline

    @property
    def steps_s(self) -> tuple[float, ...]:
        """Every step: from the first rank's start to the last rank's end."""
        steps = [[s for s in self.spans if s.kind == "step" and s.attrs["step"] == k] for k in range(self.config.steps)]
        return tuple(max(s.end_s for s in one) - min(s.start_s for s in one) for one in steps)

    @property
    def losses(self) -> tuple[float, ...]:
        """The global mean loss of every step, before its update: tp rank 0 of each place adds its share."""
        counted = [v["losses"] for v in self.got.values if v["position"][3] == 0]
        return tuple(sum(one[k] for one in counted) for k in range(self.config.steps))

    @cached_property
    def weights(self) -> dict:
        """The full weights after the last step, keyed like ``reference.init_weights``."""
        return full_weights(self.got, self.layout)

    @cached_property
    def records(self) -> tuple:
        """Per rank, its comm records of the training steps."""
        steps = step_records(self.got)
        return tuple(tuple(r for r in steps if r.rank == rank) for rank in self.got.ranks)

    @property
    def biases(self) -> tuple:
        """With experts, balance "aux-free": each layer's selection bias after the last step."""
        biases = {layer: b for v in self.got.values for layer, b in v["biases"].items()}
        return tuple(biases[i] for i in sorted(biases))

    def against_reference(self, ref: TrainingReference) -> float:
        """The largest gap, over every step's loss and every final weight, against the reference."""
        gaps = [abs(a - b) for a, b in zip(self.losses, ref.losses)]
        gaps += [float((self.weights[k].to(v.dtype) - v).abs().max()) for k, v in ref.weights.items()]
        return max(gaps)

    def traffic_by_axis(self, rank: int) -> dict:
        """Per (axis, op) on ``rank``, per step: calls, buffer bytes, wire bytes."""
        return traffic_per_step(self.records[rank], self.config.steps)

    def predicted_ledgers(self) -> tuple[dict, ...]:
        """``predict.predict_ledger`` for this run: compare with ``ledgers``, rank by rank."""
        return predict_ledger(self.config, self.layout, self.stage_layers)

    def predicted_traffic(self, rank: int) -> dict:
        """``predict.predict_traffic`` for ``rank``: compare with ``traffic_by_axis(rank)``."""
        return predict_traffic(self.config, self.layout, self.stage_layers, rank)

    def traffic_mismatches(self) -> list[str]:
        """Where the measured traffic differs from ``predicted_traffic`` (empty: it matches), in words. Every
        axis, rank by rank: calls, buffer and wire bytes; on the ep axis (the router decides how many rows
        each rank's experts serve) the calls rank by rank and the buffer bytes summed over each ep group."""
        out = []
        for rank in range(self.layout.world_size):
            got, want = self.traffic_by_axis(rank), self.predicted_traffic(rank)
            for key in sorted(set(got) | set(want)):
                g, w = got.get(key, (0, 0, 0)), want.get(key, (0, 0, 0))
                if (g if key[0] != "ep" else g[0]) != (w if key[0] != "ep" else w[0]):
                    out.append(f"rank {rank} {key[0]} {key[1]}: predicted {w}, measured {g}")
        for group in self.layout.ep_groups() if self.layout.ep > 1 else []:
            key = ("ep", "all_to_all_single")
            # summed over the group's records before the division by steps: each rank's share varies per step
            got = sum(r.size_bytes for g in group for r in self.records[g] if (r.group, r.op) == key
                      ) // self.config.steps
            want = sum(self.predicted_traffic(r).get(key, (0, 0, 0))[1] for r in group)
            if got != want:
                out.append(f"ep group {group}: predicted {want:,} buffer bytes, measured {got:,}")
        return out


def run_training(ranks, layout: Layout, config: TrainingConfig, stage_counts=None) -> TrainingRun:
    """Train the toy language model on ``layout`` over the pool ``ranks`` (checked here first)."""
    check_mesh(layout, ranks.world_size, "ranks")
    stage_layers = check_training(layout, config, stage_counts)
    return TrainingRun(layout, config, on_ranks(ranks, training_on_rank, layout, config, stage_layers), stage_layers)
