"""DDP, ZeRO-1 and ZeRO-2 on one rank: full weights in flat buckets, gradients reduced bucket by bucket.

Every rank holds the whole model. Its parameters are moved into flat buffers, one per bucket
(``flat.plan_buckets``), and the model's parameters become views of those buffers, so one collective
moves a whole bucket. What differs is what each rank keeps and what it sends:

* **DDP** (Li et al. 2020): the full gradient of every bucket, all-reduced (summed); every rank then
  runs AdamW on all the weights. Memory: full weights, full gradients, full optimizer state.
* **ZeRO-1** (Rajbhandari et al. 2020, P_os): after the backward, each bucket's gradient is
  reduce-scattered: rank ``r`` receives the sum of its own shard only, updates only that shard (so it
  keeps AdamW's state for ``1/N`` of the weights), and all-gathers the updated weights.
* **ZeRO-2** (P_os+g): the same, but each bucket is reduce-scattered as soon as its gradients exist and
  the full gradient is dropped: a rank keeps only its shard's gradients.

**Overlap.** A hook on every parameter (``register_post_accumulate_grad_hook``) fires as soon as the
backward pass has finished that parameter's gradient. It copies the gradient into its bucket; when the
bucket is complete, and every earlier bucket has been launched, the bucket's collective is launched
with ``async_op=True`` while the backward pass goes on with earlier layers. The comm log's ``waited_s``
then says how long the rank really waited. With ``overlap=False`` the collectives run one after
another once the backward has finished: the no-overlap step to compare with. (ZeRO-1 always reduces
after the backward: it keeps the full gradient anyway.)
"""

from __future__ import annotations

import contextlib
from functools import partial

import torch
from torch import nn

from ..runtime.measure import PeakMeter, optimizer_state_bytes, tensor_bytes
from .flat import plan_buckets


def owner_of(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module that holds parameter ``name`` (``"0.up.weight"``) and the attribute's own name."""
    prefix, _, attr = name.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), attr


class BucketedReplica:
    """A rank's copy of ``model`` for ``strategy`` (``"ddp"``, ``"zero1"`` or ``"zero2"``): see the module
    docstring. ``owned`` are the parameters this rank's optimizer updates: each bucket whole (DDP) or
    this rank's shard of each bucket (ZeRO-1/2), views of the same buffers."""

    def __init__(self, ctx, model: nn.Module, strategy: str, bucket_bytes: float | None, overlap: bool) -> None:
        self.ctx, self.model, self.strategy, self.overlap = ctx, model, strategy, overlap
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        first = named[0][1]
        self.groups = plan_buckets([p.numel() for _, p in named], first.element_size(),
                                   1 if strategy == "ddp" else ctx.world_size, bucket_bytes)
        self.meter = PeakMeter()
        self.flats: list[torch.Tensor] = []  # per bucket: the weights, (padded_numel,)
        self.grads: list[torch.Tensor] = []  # per bucket: full (DDP, ZeRO-1) or this rank's shard (ZeRO-2)
        self.owned: list[nn.Parameter] = []
        self.ranges: list[tuple[int, int]] = []
        self._place: dict[int, tuple[int, int, int]] = {}  # parameter index -> (bucket, offset, numel)
        for g in self.groups:
            flat = torch.zeros(g.padded_numel, dtype=first.dtype, device=ctx.device)
            for i, offset, numel in zip(g.params, g.offsets, g.numels):
                name, param = named[i]
                flat[offset:offset + numel].copy_(param.detach().flatten())
                owner, attr = owner_of(model, name)
                owner._parameters[attr] = nn.Parameter(flat[offset:offset + numel].view_as(param))
                self._place[i] = (g.index, offset, numel)
            start, stop = (0, g.padded_numel) if strategy == "ddp" else g.owned(ctx.rank)
            grad = torch.zeros(stop - start if strategy == "zero2" else g.padded_numel, dtype=flat.dtype,
                               device=ctx.device)
            mine = nn.Parameter(flat[start:stop])  # this rank's part of the weights, same storage
            mine.grad = grad if strategy != "zero1" else grad[start:stop]
            self.flats.append(flat)
            self.grads.append(grad)
            self.owned.append(mine)
            self.ranges.append((start, stop))
        self.params = [dict(model.named_parameters())[n] for n in self.names]
        for i, p in enumerate(self.params):
            p.register_post_accumulate_grad_hook(partial(self._ready, i))
        self.start_step()

    # -- during the backward -----------------------------------------------------------------------
    def start_step(self) -> None:
        self._missing = [len(g.params) for g in self.groups]
        self._next = 0  # the next bucket to launch: always in order, the same on every rank
        self._staging: dict[int, torch.Tensor] = {}  # ZeRO-2: a bucket's full gradient, on its way
        self._pending: list[tuple[int, object]] = []
        self._seen: set[int] = set()

    def _ready(self, i: int, param: torch.Tensor) -> None:
        """A parameter's gradient is finished: copy it into its bucket and launch what is complete."""
        b, offset, numel = self._place[i]
        if self.strategy == "zero2":
            if b not in self._staging:
                self._staging[b] = self.meter.track(torch.zeros_like(self.flats[b]))  # (padded_numel,)
            target = self._staging[b]
        else:
            target = self.grads[b]
        target[offset:offset + numel].copy_(self.meter.track(param.grad).flatten())
        param.grad = None  # the bucket holds it now
        self._seen.add(i)
        self._missing[b] -= 1
        if self.overlap and self.strategy != "zero1":
            while self._next < len(self.groups) and self._missing[self._next] == 0:
                self._launch(self._next, async_op=True)

    def _launch(self, b: int, async_op: bool) -> None:
        self._next = b + 1
        comm = self.ctx.comm
        if self.strategy == "ddp":
            pending = comm.all_reduce(self.grads[b], async_op=async_op)  # summed in place
        elif self.strategy == "zero1":
            start, stop = self.ranges[b]
            self.grads[b][start:stop].copy_(comm.reduce_scatter(self.grads[b]))  # the sum of my shard
            return
        else:
            pending = comm.reduce_scatter(self._staging.pop(b), async_op=async_op)
            if not async_op:
                self.grads[b].copy_(pending)  # (shard_numel,): the sum of my shard of bucket b
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
            gathered = self.meter.track(self.ctx.comm.all_gather(flat[start:stop]))  # (padded_numel,)
            flat.copy_(gathered)

    def memory(self, optimizer: torch.optim.Optimizer) -> dict[str, int]:
        """Bytes kept between steps, and the transient peak (gradients on their way into buckets,
        ZeRO-2's staged buckets, all-gathered weights)."""
        return {"params": tensor_bytes(self.flats), "grads": tensor_bytes(self.grads),
                "optimizer": optimizer_state_bytes(optimizer), "transient_peak": self.meter.peak_bytes}

    def full_state(self) -> dict[str, torch.Tensor]:
        """The trained weights by the model's own names (every rank holds all of them)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
