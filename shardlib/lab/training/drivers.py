"""The training step on a pool of ranks: every layout checked before any rank starts, run, gathered, compared.

``check_training``: every rule a layout must meet for the toy language model, in the learner's terms.
``training_on_rank`` builds ``step.TrainingStep`` with a ``lab.measure.ActivationProbe`` attached and runs
every step on this replica's rows of the corpus's batches, each a ``"step"`` span. The probe counts what
autograd saves while each microbatch is in flight (from its ``F`` to its ``B``, or its ``W``) and keeps the
peak, and follows ZeRO-3's gathered weights (the transient peak); after the last step ``ledger`` reads the
bytes the rank keeps. ``run_training`` runs it on a warm pool (``lab.harness.on_ranks``) and reads it as a
``TrainingRun``: every step's global loss, the full weights (keyed like ``reference.init_weights``), each
rank's ledger and comm records, beside the reference (``against_reference``) and the predictions.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.core.mesh import Layout, check_mesh
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.pipeline.stages import split_layers
from shardlib.core.tensor_parallel.layers import ROW_PARALLEL
from shardlib.core.training.config import TrainingConfig, init_weights
from shardlib.core.training.corpus import MarkovCorpus
from shardlib.core.training.reference import TrainingReference
from shardlib.core.training.step import TrainingStep
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.measure import ActivationProbe, optimizer_state_bytes, tensor_bytes
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
    if config.is_moe and layout.cp > 1:
        raise ValueError(f"experts with a context-parallel ring (cp = {layout.cp}) are not combined in this step: "
                         "use cp = 1")
    if config.is_moe and layout.dp_strategy == "zero3":
        raise ValueError("experts with ZeRO-3 are not combined in this step: use ddp, zero1 or zero2")
    problems = tensor_parallel_problems(config.model, layout.tp, copy_kv_heads=False)
    if config.vocab_size % layout.tp:  # the toy's vocabulary is not padded
        problems.append(f"a vocabulary of {config.vocab_size} does not split evenly over tp = {layout.tp} ranks")
    if problems:
        raise ValueError("; ".join(problems))
    pieces = layout.cp * layout.tp * (2 if layout.cp > 1 else 1)
    if config.seq % pieces:
        how = (f"2 x cp x tp = 2 x {layout.cp} x {layout.tp} = {pieces} equal pieces (zigzag gives each ring place "
               "two chunks; sequence parallelism cuts each place's tokens tp ways)" if layout.cp > 1 else
               f"tp = {layout.tp} equal pieces for sequence parallelism")
        raise ValueError(f"a sequence of {config.seq} tokens does not split into {how}")
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


def ledger(step: TrainingStep, probe: ActivationProbe) -> dict[str, int]:
    """Bytes this rank keeps, read when the optimizer has stepped, from the data-parallel mechanism's own
    buffers: ``BucketedReplica``'s buckets (the model's weights and, DDP and ZeRO-1, its whole gradient;
    ZeRO-2, its shard; a bucket's padding, fewer than ``dp x cp`` elements, left out; the shard AdamW
    updates is a view of them, not a buffer of its own), or ZeRO-3's shards. Then AdamW's state, the
    activations' in-flight peak and the transient peak."""
    weights = grads = 0
    for dp in step.replicas or (step.dp,):  # with experts: the tp-split weights', the routers', the experts'
        if isinstance(dp, ShardedUnits):
            weights, grads = tensor_bytes(dp.owned), tensor_bytes(shard.grad for shard in dp.owned)
            continue
        e = dp.flats[0].element_size()
        weights += sum(g.numel for g in dp.groups) * e  # the model's weights, in the buckets
        grads += sum(g.numel * e if grad.numel() == g.padded_numel else tensor_bytes([grad])
                     for g, grad in zip(dp.groups, dp.grads))  # a whole bucket's gradient, or ZeRO-2's shard
    return {"weights": weights, "gradients": grads, "optimizer": optimizer_state_bytes(step.optimizer),
            "activations": probe.peak_activation_bytes, "transient": probe.meter.peak_bytes}


def training_on_rank(ctx, layout, config, stage_layers) -> dict:
    """Train on this rank's part of ``layout`` (``stage_layers``: per virtual stage), each step a ``"step"``
    span. Returns its place (``position``: stage, replica, cp rank, tp rank), its share of each step's
    global loss, its ``ledger``, its weight ``shards`` (tp slices, by the stage model's names) and, with
    experts, its place in its ep group and each of its layers' selection bias after the last step."""
    probe = ActivationProbe(ctx.timeline, hooks=False)  # the step's own hooks call probe.on_saved
    weights = {k: v.to(ctx.device) for k, v in init_weights(config).items()}
    step = TrainingStep(ctx, layout, config, weights, stage_layers, probe, probe.on_saved)
    probe.release = "W" if step.schedule.split_backward else "B"
    probe.param_ptrs.update(p.data_ptr() for chunk in step.chunks for p in chunk.parameters())
    corpus, me, rows = MarkovCorpus(config), step.me, config.microbatch * config.m
    losses = []
    for k in range(config.steps):
        tokens = corpus.batch(k, config.global_batch(layout.dp))[me.replica * rows:(me.replica + 1) * rows]
        with ctx.timeline.span(f"step {k}", kind="step", step=k):
            losses.append(step.run(tokens.to(ctx.device)))
    kept = ledger(step, probe)
    if layout.dp_strategy == "zero3":  # gathered over dp x cp: a collective every rank of the group joins
        shards = step.dp.full_state()
    else:
        shards = {n: p.detach().clone() for chunk in step.chunks for n, p in chunk.named_parameters()}
    moe = step.moe_layers() if config.is_moe else []
    return {"position": tuple(me), "losses": tuple(losses), "ledger": kept, "shards": shards,
            "ep_place": step.experts_groups.place if config.is_moe else 0,
            "biases": {layer: m.bias for layer, m in zip((i for c in step.chunks for i in c.layers), moe)
                       if m.bias is not None}}


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


@dataclass(frozen=True)
class TrainingRun:
    """The toy language model trained on ``layout`` (``got``: what ``on_ranks`` gathered from
    ``training_on_rank``), read as the notebooks read it."""

    layout: Layout
    config: TrainingConfig
    got: Measured
    stage_layers: tuple  # the layers of each virtual stage

    positions = property(lambda self: self.got.each("position"))  # per rank: (stage, replica, cp_rank, tp_rank)
    ledgers = property(lambda self: self.got.each("ledger"))  # per rank: bytes kept, activations' and transient peak

    @property
    def steps_s(self) -> tuple[float, ...]:
        """Every step: from the first rank's start to the last rank's end."""
        steps = [[s for s in self.got.timeline if s.kind == "step" and s.attrs["step"] == k]
                 for k in range(self.config.steps)]
        return tuple(max(s.end_s for s in one) - min(s.start_s for s in one) for one in steps)

    @property
    def losses(self) -> tuple[float, ...]:
        """The global mean loss of every step, before its update: tp rank 0 of each place adds its share."""
        counted = [v["losses"] for v in self.got.values if v["position"][3] == 0]
        return tuple(sum(one[k] for one in counted) for k in range(self.config.steps))

    @cached_property
    def weights(self) -> dict:
        """The full weights after the last step, keyed like ``reference.init_weights``, from the ranks' shards:
        each tp slice from replica 0 at ring place 0, each router from tp rank 0 there, each block of experts
        from the rank at its place of its stage's first ep group."""
        pieces: dict = {}
        per_stage = self.layout.tp * self.layout.dp * self.layout.cp
        first_ep = {r for g in self.layout.ep_groups() if g[0] % per_stage == 0 for r in g}
        for rank, value in zip(self.got.ranks, self.got.values):
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
        """``predict_ledger`` for this run: compare with ``ledgers``, rank by rank."""
        return predict_ledger(self.config, self.layout, self.stage_layers)

    def traffic_mismatches(self) -> list[str]:
        """Where the measured traffic differs from ``predict_traffic`` (empty: it matches), in words. Every
        axis, rank by rank: calls, buffer and wire bytes; on the ep axis (the router decides how many rows
        each rank's experts serve) the calls rank by rank and the buffer bytes summed over each ep group."""
        out, ranks = [], range(self.layout.world_size)
        predicted = [predict_traffic(self.config, self.layout, self.stage_layers, rank) for rank in ranks]
        for rank in ranks:
            got, want = self.traffic_by_axis(rank), predicted[rank]
            for key in sorted(set(got) | set(want)):
                g, w = got.get(key, (0, 0, 0)), want.get(key, (0, 0, 0))
                if (g if key[0] != "ep" else g[0]) != (w if key[0] != "ep" else w[0]):
                    out.append(f"rank {rank} {key[0]} {key[1]}: predicted {w}, measured {g}")
        for group in self.layout.ep_groups() if self.layout.ep > 1 else []:
            key = ("ep", "all_to_all_single")
            # summed over the group's records before the division by steps: each rank's share varies per step
            got = sum(r.size_bytes for g in group for r in self.records[g] if (r.group, r.op) == key
                      ) // self.config.steps
            want = sum(predicted[r].get(key, (0, 0, 0))[1] for r in group)
            if got != want:
                out.append(f"ep group {group}: predicted {want:,} buffer bytes, measured {got:,}")
        return out


def run_training(ranks, layout: Layout, config: TrainingConfig, stage_counts=None) -> TrainingRun:
    """Train the toy language model on ``layout`` over the pool ``ranks`` (checked here first)."""
    check_mesh(layout, ranks.world_size, "ranks")
    stage_layers = check_training(layout, config, stage_counts)
    return TrainingRun(layout, config, on_ranks(ranks, training_on_rank, layout, config, stage_layers), stage_layers)
