"""DDP, ZeRO-1 and ZeRO-2 on one rank: all the weights in flat buckets, gradients reduced bucket by bucket.

Li et al. 2020 (PyTorch DDP: gradient buckets, all-reduce overlapped with the backward) and Rajbhandari
et al. 2020 (ZeRO, sections 5.1-5.2: P_os and P_os+g). The model's parameters become views of flat buckets
(``flat.plan_buckets``); as the backward finishes a bucket's last gradient, the bucket is sent::

    DDP      all-reduce the bucket's gradient          every rank gets the sum      (padded_numel,)
    ZeRO-1   reduce-scatter it, after the backward     rank r: its shard's sum      (padded_numel / N,)
    ZeRO-2   reduce-scatter it at once, keep my shard  rank r: its shard's sum      (padded_numel / N,)

AdamW then updates ``owned`` (every bucket whole, or this rank's shard), and ZeRO all-gathers the
updated shards. ``probe`` (``runtime.measure.Probe``) is shown every short-lived buffer; by default it
does nothing.
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
from torch import nn

from ..runtime.measure import NO_PROBE
from .flat import FlatGroup, plan_buckets


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module that holds parameter ``name`` (``"0.up.weight"``) and the attribute's own name."""
    prefix, _, attr = name.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), attr


class BucketedReplica:
    """A rank's copy of ``model`` for ``strategy`` (``"ddp"``, ``"zero1"`` or ``"zero2"``). ``owned`` are the
    parameters this rank's optimizer updates, views of the same buffers as the model's."""

    def __init__(self, ctx, model: nn.Module, strategy: str, bucket_bytes: float | None, overlap: bool,
                 probe=NO_PROBE) -> None:
        self.ctx, self.model, self.strategy, self.overlap, self.probe = ctx, model, strategy, overlap, probe
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.groups = plan_buckets([p.numel() for _, p in named], named[0][1].element_size(),
                                   1 if strategy == "ddp" else ctx.world_size, bucket_bytes)
        self.flats: list[torch.Tensor] = []  # per bucket: the weights, (padded_numel,)
        self.grads: list[torch.Tensor] = []  # per bucket: full (DDP, ZeRO-1) or this rank's shard (ZeRO-2)
        self.owned: list[nn.Parameter] = []
        self.ranges: list[tuple[int, int]] = []
        self._place: dict[int, tuple[int, int, int]] = {}  # parameter index -> (bucket, offset, numel)
        for g in self.groups:
            self._build_bucket(g, named)
        self.params = [dict(model.named_parameters())[n] for n in self.names]
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(partial(self._ready, i))
        self.start_step()

    def _build_bucket(self, g: FlatGroup, named: list[tuple[str, nn.Parameter]]) -> None:
        """Lay bucket ``g``'s parameters end to end; hand the optimizer all of it (DDP) or my shard (ZeRO)."""
        flat = torch.zeros(g.padded_numel, dtype=named[0][1].dtype, device=self.ctx.device)  # (padded_numel,)
        for i, offset, numel in zip(g.params, g.offsets, g.numels):
            name, param = named[i]
            flat[offset:offset + numel].copy_(param.detach().flatten())
            owner, attr = owner_of(self.model, name)
            owner._parameters[attr] = nn.Parameter(flat[offset:offset + numel].view_as(param))  # a view now
            self._place[i] = (g.index, offset, numel)
        start, stop = (0, g.padded_numel) if self.strategy == "ddp" else g.owned(self.ctx.rank)
        size = stop - start if self.strategy == "zero2" else g.padded_numel  # ZeRO-2 keeps only its shard's
        grad = torch.zeros(size, dtype=flat.dtype, device=self.ctx.device)
        mine = nn.Parameter(flat[start:stop])  # what this rank's AdamW updates: (padded_numel / N,) under ZeRO
        mine.grad = grad[start:stop] if self.strategy == "zero1" else grad
        self.flats.append(flat)
        self.grads.append(grad)
        self.owned.append(mine)
        self.ranges.append((start, stop))

    # -- during the backward -----------------------------------------------------------------------
    def start_step(self) -> None:
        self._missing = [len(g.params) for g in self.groups]
        self._next = 0  # the next bucket to launch: always in order, the same on every rank
        self._staging: dict[int, torch.Tensor] = {}  # ZeRO-2: a bucket's full gradient, on its way
        self._pending: list[tuple[int, object]] = []
        self._seen: set[int] = set()

    def _ready(self, i: int, param: torch.Tensor) -> None:
        """Hook: parameter ``i``'s gradient is finished. Copy it into its bucket; launch the buckets now full."""
        b, offset, numel = self._place[i]
        if self.strategy == "zero2" and b not in self._staging:  # the full gradient lives only until it is sent
            self._staging[b] = torch.zeros_like(self.flats[b])  # (padded_numel,)
        bucket = self._staging[b] if self.strategy == "zero2" else self.grads[b]
        with self.probe.span("fill bucket", kind="memory", bucket=b, grad=param.grad, staged=self._staging.get(b)):
            bucket[offset:offset + numel].copy_(param.grad.flatten())
        param.grad = None  # the bucket holds it now
        self._seen.add(i)
        self._missing[b] -= 1
        if self.overlap and self.strategy != "zero1":  # ZeRO-1 keeps the full gradient: it reduces after
            while self._next < len(self.groups) and self._missing[self._next] == 0:
                self._launch(self._next, async_op=True)  # in flight while the backward goes on

    def _launch(self, b: int, async_op: bool) -> None:
        """Send bucket ``b``'s gradient: DDP all-reduces it; ZeRO reduce-scatters it, rank r keeping its shard's sum."""
        self._next = b + 1
        comm = self.ctx.comm
        if self.strategy == "ddp":
            pending = comm.all_reduce(self.grads[b], async_op=async_op)  # (padded_numel,), summed in place
        elif self.strategy == "zero1":
            start, stop = self.ranges[b]
            self.grads[b][start:stop].copy_(comm.reduce_scatter(self.grads[b]))  # (padded_numel / N,)
            return
        else:
            pending = comm.reduce_scatter(self._staging.pop(b), async_op=async_op)  # (padded_numel / N,)
            if not async_op:
                self.grads[b].copy_(pending)
        if async_op:
            self._pending.append((b, pending))

    def finish_backward(self) -> None:
        """Launch what is left (everything, without overlap), then wait for every bucket in order."""
        unused = [name for i, name in enumerate(self.names) if i not in self._seen]
        if unused:
            raise RuntimeError(f"parameters {unused} got no gradient: every parameter must take part in the loss")
        while self._next < len(self.groups):
            self._launch(self._next, async_op=False)
        for b, pending in self._pending:
            result = pending.wait()
            if self.strategy == "zero2":
                self.grads[b].copy_(result)
        self._pending.clear()

    def forward_context(self):
        """Nothing to swap during the forward: every rank holds all the weights."""
        return contextlib.nullcontext()

    # -- after the optimizer -----------------------------------------------------------------------
    def after_step(self) -> None:
        """ZeRO-1/2: all-gather every rank's updated shard, so each rank holds all the new weights."""
        if self.strategy == "ddp":
            return
        for b, flat in enumerate(self.flats):
            start, stop = self.ranges[b]
            gathered = self.ctx.comm.all_gather(flat[start:stop])  # (padded_numel,): every rank's shard
            with self.probe.span("copy gathered", kind="memory", bucket=b, gathered=gathered):
                flat.copy_(gathered)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The trained weights by the model's own names (every rank holds all of them)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
