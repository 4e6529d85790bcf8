"""DDP, ZeRO-1 and ZeRO-2 on one rank: all the weights in flat buckets, gradients reduced bucket by bucket.

Li et al. 2020 (PyTorch DDP: gradient buckets, all-reduce overlapped with the backward) and Rajbhandari
et al. 2020 (ZeRO, sections 5.1-5.2: P_os and P_os+g). The model's parameters become views of flat buckets
(``flat.plan_buckets``); as the backward finishes a bucket's last gradient, the bucket is sent::

    DDP      all-reduce the bucket's gradient          every rank gets the sum      (padded_numel,)
    ZeRO-1   reduce-scatter it, after the backward     rank r: its shard's sum      (padded_numel / N,)
    ZeRO-2   reduce-scatter it at once, keep my shard  rank r: its shard's sum      (padded_numel / N,)

Over ``microbatches`` backwards per step (gradient accumulation) each gradient is added into its bucket;
DDP and ZeRO-1 send a bucket once, after its last microbatch (DDP's ``no_sync`` for the others), ZeRO-2
after every microbatch. AdamW then updates ``owned`` (every bucket whole, or this rank's shard: a view of
the bucket), and ZeRO all-gathers the updated shards. ``probe`` (``core.probe.Probe``) is shown every
short-lived buffer; by default it does nothing.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
from torch import nn

from shardlib.core.data_parallel.flat import FlatGroup, plan_buckets
from shardlib.core.probe import NO_PROBE


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module that holds parameter ``name`` (``"0.up.weight"``) and the attribute's own name."""
    prefix, _, attr = name.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), attr


class BucketedReplica:
    """A rank's copy of ``model`` for ``strategy`` (``"ddp"``, ``"zero1"`` or ``"zero2"``) over ``group``, the
    replicas: ``ctx`` (every rank) or a ``ctx.group(...)``. ``owned`` are the parameters this rank's optimizer
    updates, views of the same buffers as the model's."""

    def __init__(self, group, model: nn.Module, strategy: str, bucket_bytes: float | None, overlap: bool,
                 probe=NO_PROBE, microbatches: int = 1) -> None:
        self.group, self.model, self.strategy, self.overlap, self.probe = group, model, strategy, overlap, probe
        self.microbatches = microbatches  # backwards per step: gradients accumulate in the buckets
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.groups = plan_buckets([p.numel() for _, p in named], named[0][1].element_size(),
                                   1 if strategy == "ddp" else group.world_size, bucket_bytes)
        self.flats: list[torch.Tensor] = []  # per bucket: the weights, (padded_numel,)
        self.grads: list[torch.Tensor] = []  # per bucket: full (DDP, ZeRO-1) or this rank's shard (ZeRO-2)
        self.owned: list[nn.Parameter] = []
        self._place: dict[int, tuple[int, int, int]] = {}  # parameter index -> (bucket, offset, numel)
        for g in self.groups:
            self._build_bucket(g, named)
        self.params = [dict(model.named_parameters())[n] for n in self.names]
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(partial(self._ready, i))
        # what is sent, in order, the same on every rank: (microbatch, bucket). DDP and ZeRO-1 send a bucket
        # once, after its last microbatch (DDP's no_sync before it); ZeRO-2 reduce-scatters after every one.
        rounds = range(microbatches) if strategy == "zero2" else [microbatches - 1]
        self._order = [(r, b) for r in rounds for b in range(len(self.groups))]
        self.start_step()

    def _build_bucket(self, g: FlatGroup, named: list[tuple[str, nn.Parameter]]) -> None:
        """Lay bucket ``g``'s parameters end to end; the optimizer gets all of it (DDP) or my shard (ZeRO)."""
        flat = torch.zeros(g.padded_numel, dtype=named[0][1].dtype, device=self.group.device)  # (padded_numel,)
        for i, offset, numel in zip(g.params, g.offsets, g.numels):
            name, param = named[i]
            flat[offset:offset + numel].copy_(param.detach().flatten())
            owner, attr = owner_of(self.model, name)
            owner._parameters[attr] = nn.Parameter(flat[offset:offset + numel].view_as(param))  # a view now
            self._place[i] = (g.index, offset, numel)
        start, stop = (0, g.padded_numel) if self.strategy == "ddp" else g.owned(self.group.rank)
        size = stop - start if self.strategy == "zero2" else g.padded_numel  # ZeRO-2 keeps only its shard's
        grad = torch.zeros(size, dtype=flat.dtype, device=self.group.device)
        mine = nn.Parameter(flat[start:stop])  # what this rank's AdamW updates: (padded_numel / N,) under ZeRO
        mine.grad = grad[start:stop] if self.strategy == "zero1" else grad
        self.flats.append(flat)
        self.grads.append(grad)
        self.owned.append(mine)

    # -- during the backward -----------------------------------------------------------------------
    def start_step(self) -> None:
        self._count = [0] * len(self.params)  # gradients each parameter has had this step (one per microbatch)
        self._next = 0  # the next (microbatch, bucket) of ``_order`` to send
        self._staging: dict[int, torch.Tensor] = {}  # ZeRO-2: a bucket's full gradient, on its way
        self._pending: list[tuple[int, object]] = []
        for grad in self.grads:
            grad.zero_()  # every microbatch's gradient is added in

    def _ready(self, i: int, param: torch.Tensor) -> None:
        """Hook: parameter ``i``'s gradient is finished. Add it into its bucket; send what is now complete."""
        b, offset, numel = self._place[i]
        if self.strategy == "zero2" and b not in self._staging:  # the full gradient lives only until it is sent
            self._staging[b] = torch.zeros_like(self.flats[b])  # (padded_numel,)
        bucket = self._staging[b] if self.strategy == "zero2" else self.grads[b]
        with self.probe.span("fill bucket", kind="memory", bucket=b, grad=param.grad, staged=self._staging.get(b)):
            bucket[offset:offset + numel].add_(param.grad.flatten())
        param.grad = None  # the bucket holds it now
        self._count[i] += 1
        while self._next < len(self._order):
            r, b = self._order[self._next]
            if any(self._count[j] <= r for j in self.groups[b].params):
                break  # bucket b still lacks a gradient of microbatch r
            if r == self.microbatches - 1 and not (self.overlap and self.strategy != "zero1"):
                break  # the last one waits for finish_backward (ZeRO-1 keeps the full gradient: it reduces after)
            self._launch(b, async_op=self.overlap)  # in flight while the backward goes on

    def _launch(self, b: int, async_op: bool) -> None:
        """Send bucket ``b``'s gradient: DDP all-reduces it; ZeRO reduce-scatters it, rank r keeping its shard's sum."""
        self._next += 1
        comm = self.group.comm
        if self.strategy == "ddp":
            pending = comm.all_reduce(self.grads[b], async_op=async_op)  # (padded_numel,), summed in place
        elif self.strategy == "zero1":
            self.owned[b].grad.copy_(comm.reduce_scatter(self.grads[b]))  # (padded_numel / N,): my shard's sum
            return
        else:
            pending = comm.reduce_scatter(self._staging.pop(b), async_op=async_op)  # (padded_numel / N,)
            if not async_op:
                self.grads[b].add_(pending)
        if async_op:
            self._pending.append((b, pending))

    def finish_backward(self) -> None:
        """Wait for every bucket in flight, in order, then send what is left (everything, without overlap)."""
        unused = [n for i, n in enumerate(self.names) if self._count[i] < self.microbatches]
        if unused:
            every = "" if self.microbatches == 1 else f" in every one of the step's {self.microbatches} microbatches"
            raise RuntimeError(f"parameters {unused} got no gradient{every}: every parameter must take part in "
                               "the loss")
        for b, pending in self._pending:
            result = pending.wait()
            if self.strategy == "zero2":
                self.grads[b].add_(result)
        self._pending.clear()
        while self._next < len(self._order):
            self._launch(self._order[self._next][1], async_op=False)

    def forward_context(self):  # every rank holds all the weights: nothing to swap
        return contextlib.nullcontext()

    # -- after the optimizer -----------------------------------------------------------------------
    def after_step(self) -> None:
        """ZeRO-1/2: all-gather every rank's updated shard, so each rank holds all the new weights."""
        if self.strategy == "ddp":
            return
        for b, flat in enumerate(self.flats):
            gathered = self.group.comm.all_gather(self.owned[b].detach())  # (padded_numel,): every rank's shard
            with self.probe.span("copy gathered", kind="memory", bucket=b, gathered=gathered):
                flat.copy_(gathered)

    def full_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
