"""The training step on a rank, measured: spans, the activations autograd keeps, the bytes kept.

``training_on_rank`` builds ``step.TrainingStep`` with a ``lab.measure.ActivationProbe`` attached and
runs every step on this replica's rows of the corpus's batches, each a ``"step"`` span. The probe puts
each ``F``/``B`` on the rank's timeline, counts what autograd saves during each microbatch's forward,
adds it while the microbatch is in flight (from its ``F`` to its ``B``, or its ``W``) and keeps the peak,
and follows ZeRO-3's gathered weights (the transient peak). After the last step it reads the bytes the
rank keeps: weights, gradients and AdamW's state.
"""

from __future__ import annotations

from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.core.training.config import init_weights
from shardlib.core.training.corpus import MarkovCorpus
from shardlib.core.training.step import TrainingStep
from shardlib.lab.measure import ActivationProbe, optimizer_state_bytes, tensor_bytes


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
    global loss, its ``ledger``, what autograd saved for each microbatch (and chunk) of the first step, its
    weight ``shards`` (tp slices, by the stage model's names) and, with experts, its place in its ep group
    and each of its layers' selection bias after the last step (balance "aux-free")."""
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
            "activation_bytes": tuple(probe.per_microbatch[:config.m * step.schedule.n_chunks]),
            "ep_place": step.experts_groups.place if config.is_moe else 0,
            "biases": {layer: m.bias for layer, m in zip((i for c in step.chunks for i in c.layers), moe)
                       if m.bias is not None}}
