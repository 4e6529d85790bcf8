"""The training step on a rank, measured: spans, the activations autograd keeps, the bytes kept.

``training_on_rank`` builds ``step.TrainingStep`` with a ``LedgerProbe`` attached and runs every step on
this replica's rows of the corpus's batches. The probe puts each ``F``/``B`` on the rank's timeline,
counts what autograd saves during each microbatch's forward (``runtime.measure.SavedBytes``), adds it
while the microbatch is in flight (from its ``F`` to its ``B``) and keeps the peak, and follows ZeRO-3's
gathered weights in a ``PeakMeter`` (the transient peak). After the last step it reads the bytes the
rank keeps: weights, gradients and AdamW's state (``tensor_bytes``, ``optimizer_state_bytes``).
"""

from __future__ import annotations

from contextlib import contextmanager

from ..runtime.measure import PeakMeter, Probe, SavedBytes, optimizer_state_bytes, tensor_bytes
from .corpus import MarkovCorpus
from .reference import init_weights
from .step import TrainingStep


class LedgerProbe(Probe):
    """The rank's timeline, plus the activations in flight and the transient buffers."""

    def __init__(self, timeline) -> None:
        self.timeline, self.meter = timeline, PeakMeter()
        self.saved: dict[int, SavedBytes] = {}
        self.per_microbatch: list[int] = []
        self.in_flight = self.peak_activation_bytes = 0
        self.param_ptrs: set[int] = set()

    def on_saved(self, microbatch: int):
        self.saved[microbatch] = SavedBytes(self.param_ptrs)
        return self.saved[microbatch]._pack

    @contextmanager
    def span(self, name: str, kind: str = "compute", **attrs):
        self.meter.reserve(attrs.get("gathered_bytes", 0))
        self.meter.release(attrs.get("freed_bytes", 0))
        with self.timeline.span(name, kind=kind, **attrs):
            yield
        if attrs.get("op") == "F":
            nbytes = self.saved[attrs["microbatch"]].size_bytes
            self.per_microbatch.append(nbytes)
            self.in_flight += nbytes
            self.peak_activation_bytes = max(self.peak_activation_bytes, self.in_flight)
        elif attrs.get("op") == "B":
            self.in_flight -= self.saved.pop(attrs["microbatch"]).size_bytes


def ledger(step: TrainingStep, probe: LedgerProbe) -> dict[str, int]:
    """Bytes this rank keeps, read when the optimizer has stepped: weights (ZeRO-1/2: the model's and the
    shard AdamW updates), gradients, AdamW's state; the activations' in-flight peak; the transient peak."""
    params = list(step.model.parameters()) + (list(step.dp.owned) if step.layout.dp_strategy != "ddp" else [])
    grads = [p.grad for p in params]
    return {"weights": tensor_bytes(params), "gradients": tensor_bytes(grads),
            "optimizer": optimizer_state_bytes(step.dp.optimizer), "activations": probe.peak_activation_bytes,
            "transient": probe.meter.peak_bytes}


def training_on_rank(ctx, layout, config, stage_layers) -> dict:
    """Train on this rank's part of ``layout``; return its losses, weight shards, ledger and comm marks."""
    probe = LedgerProbe(ctx.timeline)
    step = TrainingStep(ctx, layout, config, init_weights(config), stage_layers, probe, probe.on_saved)
    probe.param_ptrs.update(p.data_ptr() for p in step.model.parameters())
    corpus, me, rows = MarkovCorpus(config), step.me, config.microbatch * config.m
    losses, marks = [], [len(ctx.comm.records)]
    for k in range(config.steps):
        tokens = corpus.batch(k, config.global_batch(layout.dp))[me.replica * rows:(me.replica + 1) * rows]
        with ctx.timeline.span(f"step {k}", kind="step", step=k):
            losses.append(step.run(tokens.to(ctx.device)))
        marks.append(len(ctx.comm.records))
    kept = ledger(step, probe)
    if layout.dp_strategy == "zero3":  # gathered over dp x cp: a collective every rank of the group joins
        shards = step.dp.units.full_state()
    else:
        shards = {n: p.detach().clone() for n, p in step.model.named_parameters()}
    return {"rank": ctx.rank, "position": tuple(me), "losses": losses, "marks": marks, "ledger": kept,
            "activation_bytes": probe.per_microbatch[:config.m],
            "shards": shards if me.replica == 0 and me.cp_rank == 0 else None}
