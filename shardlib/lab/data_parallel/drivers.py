"""Data-parallel runs on a pool, read from what ``lab.harness.on_ranks`` gathered and set beside the formulas.

``run_data_parallel`` trains one strategy on every rank (``train_on_rank``: ``buckets.BucketedReplica`` or
``zero3.ShardedUnits`` with a ``lab.measure.BufferProbe`` attached, step, forward, backward and optimizer
marked on the timeline); its ``DataParallelRun`` reads the weights, the bytes kept, the comm log and the
timeline, cut into steps. ``run_peer`` trains PyTorch's own ``DistributedDataParallel`` or FSDP2's
``fully_shard`` on the same rows with the same AdamW: they must end where ``ddp`` and ``zero3`` end. They
*average* gradients, so each rank's loss is the mean over its own rows, and they call ``torch.distributed``
directly, so their traffic is not in the comm log.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import torch

from shardlib.core.adamw import AdamW
from shardlib.core.checks import choice, flag
from shardlib.core.data_parallel.buckets import BucketedReplica
from shardlib.core.data_parallel.zero3 import ShardedUnits
from shardlib.lab.data_parallel.reference import (
    check_training_inputs,
    global_mse,
    largest_gap,
    local_rows,
    train_one_process,
    train_rows,
)
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.measure import BufferProbe, optimizer_state_bytes, tensor_bytes
from shardlib.predict.data_parallel import gathered_peak_bytes, layout_memory, layout_step_bytes
from shardlib.runtime.records import CommRecord, summarize
from shardlib.runtime.timeline import Span


def train_on_rank(ctx, strategy: str, model, batches, lr: float, bucket_bytes: float | None = None,
                  overlap: bool = True, prefetch: bool = True) -> dict:
    """Train ``model`` on this rank's rows of every batch: the trained ``state_dict`` (whole), this rank's
    share of each step's global loss (``local_losses``), its flat ``groups`` and ``memory``: the bytes it keeps
    between steps (weights, gradients, AdamW's state) and the transient peak."""
    check_training_inputs(ctx.world_size, strategy, model, batches, lr, bucket_bytes)
    model = model.to(ctx.device)
    probe = BufferProbe()
    if strategy == "zero3":
        engine = ShardedUnits(ctx, model, prefetch=prefetch, overlap=overlap, probe=probe)
    else:
        engine = BucketedReplica(ctx, model, strategy, bucket_bytes, overlap, probe=probe)
    optimizer = AdamW(engine.owned, lr=lr)
    losses = []
    for k, (x, y) in enumerate(batches):
        mine = local_rows(x.shape[0], ctx.world_size, ctx.rank)
        x_mine, y_mine = x[mine].to(ctx.device), y[mine].to(ctx.device)  # (rows / dp, d_in), (rows / dp, d_out)
        engine.start_step()
        with ctx.timeline.span(f"step {k}", kind="step", step=k):
            with ctx.timeline.span("forward", step=k), engine.forward_context():
                loss = global_mse(model(x_mine), y_mine, y.numel())
            with ctx.timeline.span("backward", step=k):
                loss.backward()
            engine.finish_backward()
            with ctx.timeline.span("optimizer", step=k):
                optimizer.step()  # AdamW on what this rank owns: all the weights (DDP) or its shard (ZeRO)
            engine.after_step()
        losses.append(float(loss.detach()))
    sharded = strategy == "zero3"
    params, grads = (engine.owned, [s.grad for s in engine.owned]) if sharded else (engine.flats, engine.grads)
    memory = {"params": tensor_bytes(params), "grads": tensor_bytes(grads),
              "optimizer": optimizer_state_bytes(optimizer), "transient_peak": probe.meter.peak_bytes}
    return {"state_dict": engine.full_state(), "local_losses": losses, "memory": memory, "groups": tuple(engine.groups)}


@dataclass(frozen=True)
class DataParallelRun:
    """One training run on the ranks: rank 0's trained weights (``ranks_agree``: every rank's are these),
    per rank the bytes kept between steps and the transient peak, the global loss of each step, and every
    rank's comm log and timeline."""

    got: Measured = field(repr=False)
    strategy: str
    inputs: tuple = field(repr=False)  # (model, batches, lr)
    prefetch: bool = True  # ZeRO-3's transient peak depends on it

    world_size = property(lambda self: len(self.got.ranks))
    state_dict = property(lambda self: self.got.first("state_dict"))
    memory_per_rank = property(lambda self: self.got.each("memory"))
    losses = property(lambda self: self.got.across("local_losses", sum))  # per step, summed over the ranks
    groups = property(lambda self: self.got.first("groups"))  # flat.FlatGroup s
    spans = property(lambda self: self.got.timeline)
    element_bytes = property(lambda self: next(iter(self.inputs[0].parameters())).element_size())
    n_steps = property(lambda self: len(self.losses))
    n_params = property(lambda self: sum(g.numel for g in self.groups))

    @property
    def ranks_agree(self) -> bool:
        first = self.state_dict
        return all(sd.keys() == first.keys() and all(torch.equal(sd[k], first[k]) for k in first)
                   for sd in self.got.each("state_dict"))

    # -- steps ---------------------------------------------------------------------------------------
    def _steps(self, skip_first: bool) -> range:
        return range(1 if skip_first and self.n_steps > 1 else 0, self.n_steps)

    def step_span(self, step: int, rank: int, name: str | None = None) -> Span:
        """Rank ``rank``'s span of step ``step`` (negative counts from the end), or of its phase ``name``."""
        step = range(self.n_steps)[step]
        return next(s for s in self.got.spans(name or f"step {step}", rank) if s.attrs.get("step") == step)

    def step_records(self, step: int, rank: int | None = None) -> list[CommRecord]:
        """The calls issued during step ``step``, on one rank or on all (the final gather of ZeRO-3's
        weights, after the last step, belongs to no step)."""
        out = []
        for r in range(self.world_size) if rank is None else [rank]:
            out += self.got.within(self.step_span(step, r))
        return out

    def bytes_per_step(self, step: int = -1, rank: int = 0) -> dict[str, dict[str, float]]:
        """Per op, measured on ``rank`` in ``step``: ``count``, ``size_bytes``, ``wire_bytes`` and ``duration_s``."""
        return summarize(self.step_records(step, rank))

    def wire_bytes_per_step(self, step: int = -1, rank: int = 0) -> int:
        return sum(c.wire_bytes for c in self.step_records(step, rank))

    def _slowest_median(self, seconds, skip_first: bool) -> float:
        """The median over steps (the first, warm-up, left out) of the slowest rank's ``seconds(step, rank)``."""
        return statistics.median(max(seconds(k, r) for r in range(self.world_size)) for k in self._steps(skip_first))

    def step_s(self, skip_first: bool = True) -> float:
        """The median step time (the slowest rank's, per step)."""
        return self._slowest_median(lambda k, r: self.step_span(k, r).duration_s, skip_first)

    def comm_s(self, skip_first: bool = True) -> float:
        """The median time the slowest rank spent in communication: every call's whole duration, exposed or hidden."""
        return self._slowest_median(lambda k, r: sum(c.duration_s for c in self.step_records(k, r)), skip_first)

    def hidden_share(self, skip_first: bool = True) -> float:
        """The share of communication time hidden under compute, over the steps (first left out):
        ``1 - waited / duration`` summed over every call, where a blocking call waits for all of its
        duration and an asynchronous one only for what ``wait()`` blocked (``CommRecord.waited_s``)."""
        records = [c for k in self._steps(skip_first) for c in self.step_records(k)]
        total = sum(c.duration_s for c in records)
        exposed = sum(c.duration_s if c.waited_s is None else min(c.waited_s, c.duration_s) for c in records)
        return 0.0 if total == 0 else 1.0 - exposed / total

    def launched_during_backward(self, step: int = -1, rank: int = 0) -> int:
        """How many asynchronous calls ``rank`` issued in ``step`` before that step's backward pass ended."""
        end = self.step_span(step, rank, "backward").end_s
        return sum(1 for c in self.step_records(step, rank) if c.waited_s is not None and c.start_s < end)

    # -- predictions ---------------------------------------------------------------------------------
    def predicted_memory(self) -> dict[str, int]:
        """``predict.layout_memory`` for this run's flat groups; for ZeRO-3 also the transient peak."""
        out = layout_memory(self.groups, self.strategy, self.element_bytes)
        if self.strategy == "zero3":
            out["transient_peak"] = gathered_peak_bytes(self.groups, self.element_bytes, self.prefetch)
        return out

    def predicted_bytes_per_step(self) -> dict[str, dict[str, int]]:
        return layout_step_bytes(self.groups, self.strategy, self.element_bytes, self.world_size)

    def against_reference(self, reference: dict | None = None) -> float:
        """The largest difference from one process trained on the whole batches (within ``TOLERANCE``
        when the strategy is right). ``reference``: that process's ``state_dict``, if already trained
        (``train_one_process(model, batches, lr)``)."""
        return largest_gap(self.state_dict, train_one_process(*self.inputs) if reference is None
                           else reference)


def run_data_parallel(ranks, strategy: str, model: torch.nn.Module, batches, lr: float, *,
                      bucket_bytes: float | None = None, overlap: bool = True,
                      prefetch: bool = True) -> DataParallelRun:
    """Train ``model`` on ``batches`` with ``strategy`` (``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"``)
    on every rank of ``ranks``: each rank takes its contiguous share of each global batch's rows; the
    loss is the mean squared error over the global batch; AdamW(lr) (``reference.AdamW``, torch's arithmetic).

    ``bucket_bytes``: DDP's and ZeRO-1/2's gradient bucket size (``None``: one bucket). ``overlap``:
    launch the gradient collectives during the backward (DDP, ZeRO-2, ZeRO-3's reduce-scatters), or all
    after it. ``prefetch``: ZeRO-3 gathers the next layer while the current one computes.
    """
    check_training_inputs(ranks.world_size, strategy, model, batches, lr, bucket_bytes)
    overlap, prefetch = flag(overlap, "overlap"), flag(prefetch, "prefetch")
    got = on_ranks(ranks, train_on_rank, strategy, model, batches, lr, bucket_bytes, overlap, prefetch)
    return DataParallelRun(got, strategy, (model, batches, lr), prefetch)


train_data_parallel = run_data_parallel  # the same call, named for what it does: it trains


PEER_OF = {"torch_ddp": "ddp", "torch_fsdp2": "zero3"}


@dataclass(frozen=True)
class PeerComparison:
    """The largest difference of a peer's trained weights from this package's strategy's, and from one process's."""

    peer_to_ours: float
    peer_to_reference: float


def torch_peer_on_rank(ctx, peer: str, model, batches, lr: float) -> dict:
    """Train with ``DistributedDataParallel`` or ``fully_shard`` (one unit per child with parameters, then
    the root, as ``flat.parameter_units`` cuts ZeRO-3's); return the trained ``state_dict``, gathered whole."""
    check_training_inputs(ctx.world_size, PEER_OF[peer], model, batches, lr)
    model = model.to(ctx.device)
    if peer == "torch_ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        from torch.distributed.fsdp import fully_shard

        mesh = ctx.device_mesh((ctx.world_size,), ("dp",))
        for child in model.children():
            if any(True for _ in child.parameters()):
                fully_shard(child, mesh=mesh)
        fully_shard(model, mesh=mesh)
        wrapped = model
    train_rows(wrapped, batches, lr, ctx.world_size, ctx.rank, ctx.device)  # the peer averages over the ranks
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}


def run_peer(ranks, peer: str, model, batches, lr: float) -> PeerComparison:
    """Train with ``peer`` (``"torch_ddp"`` or ``"torch_fsdp2"``) and with the matching strategy of this
    package (``PEER_OF[peer]``: ``ddp`` or ``zero3``), and compare the trained weights."""
    strategy = PEER_OF[choice(peer, tuple(PEER_OF), "peer")]
    check_training_inputs(ranks.world_size, strategy, model, batches, lr)
    theirs = on_ranks(ranks, torch_peer_on_rank, peer, model, batches, lr).first()
    ours = run_data_parallel(ranks, strategy, model, batches, lr).state_dict
    reference = train_one_process(model, batches, lr)
    return PeerComparison(largest_gap(theirs, ours), largest_gap(theirs, reference))
