"""ZeRO-3 (FSDP's full sharding) on one rank: each unit's weights gathered just in time, then freed.

Rajbhandari et al. 2020 (ZeRO, section 5.3: P_os+g+p) and Zhao et al. 2023 (PyTorch FSDP). The model is
cut into units (``flat.parameter_units``), each laid flat (``flat.plan_units``); a rank keeps only
its shard of each, ``(padded_numel / N,)``. Per step and per unit::

    before its forward    all-gather the unit's weights       (padded_numel,) from N shards
    after its forward     free them (the backward keeps notes, not weights: ``pack``, ``unpack``)
    before its backward   all-gather them again
    after its backward    reduce-scatter the gradient         my shard's sum, (padded_numel / N,)
                          and free the weights again

``prefetch``: the next unit's gather (forward: the one after; backward: the one before) is issued
asynchronously once the current unit has its weights; ``overlap``: the reduce-scatters are asynchronous,
waited for before the step. ``probe`` (``core.probe.Probe``) is told each gather and each free.
"""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from shardlib.core.data_parallel.buckets import owner_of
from shardlib.core.data_parallel.flat import parameter_units, plan_units
from shardlib.core.probe import NO_PROBE


class _ParamSlice(tuple):
    """What the backward keeps instead of a slice of a gathered unit: ``(unit, size, stride, offset)``."""


class GatheredUnit(torch.autograd.Function):
    """Forward: the unit's full flat weights, gathered from the shards. Backward: hand their gradient to
    ``ShardedUnits.reduce`` (which reduce-scatters it into the shard's ``.grad``)."""

    @staticmethod
    def forward(ctx, shard, units: "ShardedUnits", index: int):
        ctx.units, ctx.index = units, index
        return units.take(index)  # (padded_numel,)

    @staticmethod
    def backward(ctx, grad_full):
        ctx.units.reduce(ctx.index, grad_full)
        return None, None, None


class ShardedUnits:
    """A rank's share of ``model`` under ZeRO-3 over ``group`` (``ctx``, or a ``ctx.group(...)``: the N ranks
    that share the weights). ``owned`` are the shards this rank's optimizer updates, one flat
    ``(padded_numel / N,)`` parameter per unit."""

    def __init__(self, group, model: nn.Module, prefetch: bool, overlap: bool, probe=NO_PROBE) -> None:
        self.group, self.model, self.prefetch, self.overlap, self.probe = group, model, prefetch, overlap, probe
        named = dict(model.named_parameters())
        self.names = list(named)
        units = parameter_units(model)
        index = {n: i for i, n in enumerate(self.names)}
        self.unit_names = [names for _, names in units]
        self.groups = plan_units([[index[n] for n in names] for names in self.unit_names],
                                 [p.numel() for p in named.values()], group.world_size)
        self.shapes = {n: p.shape for n, p in named.items()}
        first = next(iter(named.values()))
        self.element_bytes = first.element_size()
        self.owned: list[nn.Parameter] = []
        for names, g in zip(self.unit_names, self.groups):
            flat = torch.zeros(g.padded_numel, dtype=first.dtype, device=group.device)
            for n, offset, numel in zip(names, g.offsets, g.numels):
                flat[offset:offset + numel].copy_(named[n].detach().flatten())
            start, stop = g.owned(group.rank)
            self.owned.append(nn.Parameter(flat[start:stop].clone()))  # (padded_numel / N,): all this rank keeps
        for n in self.names:  # the model keeps no weights of its own now: the hooks lend them per unit
            owner, attr = owner_of(model, n)
            del owner._parameters[attr]
        for u, (module_name, _) in enumerate(units):
            module = model.get_submodule(module_name) if module_name else model
            module.register_forward_pre_hook(partial(self._before_forward, u))
            module.register_forward_hook(partial(self._after_forward, u))
        self._pending: dict[int, object] = {}  # unit -> its all-gather in flight (prefetch)
        self._in_forward: dict[int, torch.Tensor] = {}
        self._live: dict[int, int] = {}  # storage address of a gathered unit -> unit, while its forward runs
        self._for_backward: dict[int, torch.Tensor] = {}
        self._reductions: list[tuple[int, object]] = []
        self.start_step()

    # -- forward: gather, compute, free ------------------------------------------------------------------
    def _before_forward(self, u: int, module, args) -> None:
        """Hook: gather unit ``u``'s weights, lend them to its module, start gathering the next unit."""
        full = GatheredUnit.apply(self.owned[u], self, u)  # (padded_numel,), on the autograd graph
        for n, offset, numel in zip(self.unit_names[u], self.groups[u].offsets, self.groups[u].numels):
            owner, attr = owner_of(self.model, n)
            setattr(owner, attr, full[offset:offset + numel].view(self.shapes[n]))  # lent for this forward
        self._live[full.untyped_storage().data_ptr()] = u
        self._in_forward[u] = full
        self._prefetch(u + 1)

    def _after_forward(self, u: int, module, args, output) -> None:
        """Hook: take the weights back and free them; be called again just before this unit's backward."""
        for n in self.unit_names[u]:
            owner, attr = owner_of(self.model, n)
            delattr(owner, attr)
        self._live = {ptr: v for ptr, v in self._live.items() if v != u}
        self._free(u, self._in_forward.pop(u, None))  # the backward keeps notes, not these weights
        outputs = [t for t in (output if isinstance(output, (tuple, list)) else (output,))
                   if isinstance(t, torch.Tensor) and t.requires_grad]
        if outputs:  # fires when the gradient reaches this unit's output: just before its own backward
            torch.autograd.graph.register_multi_grad_hook(outputs, lambda grad: self._before_backward(u), mode="any")

    # -- backward: gather again, compute, reduce-scatter, free -------------------------------------------
    def _before_backward(self, u: int) -> None:
        """Gather unit ``u``'s weights again for its backward; start gathering the unit before it."""
        if u not in self._for_backward:
            self._for_backward[u] = self.take(u)
        self._prefetch(u - 1)

    def reduce(self, u: int, grad_full: torch.Tensor) -> None:
        """Unit ``u``'s backward is done (``GatheredUnit.backward``): reduce-scatter its gradient, free its weights."""
        self._free(u, self._for_backward.pop(u, None))
        self._reduced.add(u)
        result = self.group.comm.reduce_scatter(grad_full.contiguous(), async_op=self.overlap)  # (padded_numel / N,)
        if self.overlap:
            self._reductions.append((u, result))
        else:
            self._add_grad(u, result)

    # -- gathering, freeing, prefetching -----------------------------------------------------------------
    def take(self, u: int) -> torch.Tensor:
        """Unit ``u``'s full weights: the prefetched gather if one is in flight, else gathered now."""
        if u in self._pending:
            return self._pending.pop(u).wait()
        return self._gather(u, async_op=False)

    def _gather(self, u: int, async_op: bool):
        with self.probe.span("all-gather", kind="comm", unit=u, gathered_bytes=self._unit_bytes(u)):
            return self.group.comm.all_gather(self.owned[u].detach(), async_op=async_op)  # (padded_numel,)

    def _free(self, u: int, full: torch.Tensor | None) -> None:
        """Give a gathered unit's memory back now, whoever still holds the tensor (FSDP does the same)."""
        if full is not None:
            with self.probe.span("free", kind="memory", unit=u, freed_bytes=self._unit_bytes(u)):
                full.untyped_storage().resize_(0)

    def _prefetch(self, u: int) -> None:
        if (self.prefetch and 0 <= u < len(self.groups) and u not in self._pending and u not in self._for_backward
                and u not in self._reduced):
            self._pending[u] = self._gather(u, async_op=True)  # travels while unit u -/+ 1 computes

    def _unit_bytes(self, u: int) -> int:
        return self.groups[u].padded_numel * self.element_bytes

    # -- what autograd saves -----------------------------------------------------------------------------
    def pack(self, t: torch.Tensor):
        """Saved for the backward: a slice of a gathered unit becomes a note, anything else stays."""
        u = self._live.get(t.untyped_storage().data_ptr())
        return t if u is None else _ParamSlice((u, tuple(t.shape), t.stride(), t.storage_offset()))

    def unpack(self, saved):
        if not isinstance(saved, _ParamSlice):
            return saved
        u, size, stride, offset = saved
        if u not in self._for_backward:  # the output hook did not fire first (an unusual graph)
            self._for_backward[u] = self.take(u)
        return self._for_backward[u].as_strided(size, stride, offset)

    def forward_context(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    # -- the step's bookkeeping ---------------------------------------------------------------------------
    def _add_grad(self, u: int, grad: torch.Tensor) -> None:
        shard = self.owned[u]
        shard.grad = grad if shard.grad is None else shard.grad + grad  # (padded_numel / N,)

    def start_step(self) -> None:
        self._reduced: set[int] = set()  # units whose backward is done this step
        for shard in self.owned:
            shard.grad = None

    def finish_backward(self) -> None:
        """Wait for the reduce-scatters in flight; free what is still gathered (unused prefetches)."""
        for u, pending in self._reductions:
            self._add_grad(u, pending.wait())
        self._reductions.clear()
        for u, pending in list(self._pending.items()):  # guesses never used: finish them, drop them
            self._free(u, pending.wait())
        self._pending.clear()
        for u, full in list(self._for_backward.items()):
            self._free(u, full)
        self._for_backward.clear()

    def after_step(self) -> None:  # nothing to send: the next forward gathers the updated shards
        pass

    # -- reading it out ---------------------------------------------------------------------------------
    def full_state(self) -> dict[str, torch.Tensor]:
        """Every weight by the model's own names, gathered from the shards (every rank calls this)."""
        state = {}
        for u, names in enumerate(self.unit_names):
            full = self.group.comm.all_gather(self.owned[u].detach())
            for n, offset, numel in zip(names, self.groups[u].offsets, self.groups[u].numels):
                state[n] = full[offset:offset + numel].view(self.shapes[n]).clone()
        buffers = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        return {**{n: state[n] for n in self.names}, **buffers}
