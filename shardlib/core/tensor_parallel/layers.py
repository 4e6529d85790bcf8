"""Tensor parallelism on a rank: Megatron-LM's f and g, and the column- and row-parallel linear layers.

Shoeybi et al. 2019, "Megatron-LM", section 3: ``f`` (``CopyToParallelRegion``) is the identity forward
and an all-reduce of the gradient backward; ``g`` (``ReduceFromParallelRegion``) is an all-reduce
forward and the identity backward. A column-then-row pair costs one all-reduce each way. ``TPGroup``
names the ranks a layer is split over (the whole job, or one axis of a mesh); every collective goes
through ``ctx.comm``, which records it. Each layer takes the full weight and keeps its slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from shardlib.core.checks import whole_number


@dataclass(frozen=True)
class TPGroup:
    """The ``tp`` ranks one layer is split over, and this rank's place among them (``index``: which
    slice it holds). ``group`` is the process group of the sums (``None``: every rank of the job);
    ``comm`` is ``ctx.comm``, which records them."""

    tp: int
    index: int
    comm: object | None = None
    group: object | None = None

    def __post_init__(self) -> None:
        whole_number(self.tp, "tp")
        whole_number(self.index, "index (this rank's place in the tensor-parallel group)", 0)
        if self.index >= self.tp:
            raise ValueError(f"index {self.index} is outside a tensor-parallel group of {self.tp} ranks")

    @classmethod
    def world(cls, ctx) -> "TPGroup":
        """Every rank of the job, in rank order."""
        return cls(ctx.world_size, ctx.rank, ctx.comm, None)

    @classmethod
    def of_mesh(cls, ctx, mesh, axis: str = "tp") -> "TPGroup":
        """The ranks along ``axis`` of a ``DeviceMesh`` (from ``ctx.device_mesh``) that this rank is on."""
        dim = mesh.mesh_dim_names.index(axis)
        return cls(mesh.size(dim), mesh.get_local_rank(dim), ctx.comm, mesh.get_group(dim))

    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """The sum (or ``op``: ``"max"``...) over the group, on a copy (autograd may still need ``tensor``).
        One rank: itself."""
        if self.tp == 1:
            return tensor
        if self.comm is None:
            raise RuntimeError("a TPGroup without ctx.comm has no ranks to sum over")
        return self.comm.all_reduce(tensor.contiguous().clone(), op=op, group=self.group)

    def all_gather(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """Every rank's ``tensor`` joined along ``dim``, in group order."""
        return self.comm.all_gather(tensor.contiguous(), dim=dim, group=self.group)

    def all_gather_rows(self, tensor: torch.Tensor, n: int) -> torch.Tensor:
        """Every rank's share of ``n`` rows (``tensor_split``'s: the first ``n % tp`` one row longer) joined
        whole, in group order: one all-gather, each share padded to the longest. One rank: itself."""
        if self.tp == 1:
            return tensor
        longest = -(-n // self.tp)
        pad = tensor.new_zeros((longest - tensor.shape[0],) + tuple(tensor.shape[1:]))
        every = self.all_gather(torch.cat([tensor, pad]), 0)  # (tp * longest, ...)
        return torch.cat([every[r * longest:r * longest + n // self.tp + (r < n % self.tp)] for r in range(self.tp)])

    def reduce_scatter(self, tensor: torch.Tensor, dim: int) -> torch.Tensor:
        """The sum over the group, cut along ``dim``: this rank keeps its piece."""
        return self.comm.reduce_scatter(tensor.contiguous(), dim=dim, group=self.group)


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f: forward identity, backward all-reduce (sum of every rank's input gradient)."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        fctx.tpg = tpg
        return x.view_as(x)  # (..., in), the same on every rank

    @staticmethod
    def backward(fctx, grad):
        return fctx.tpg.all_reduce(grad), None  # each rank's slice gave a partial gradient: sum them


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g: forward all-reduce (sum of the partial outputs), backward identity."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        return tpg.all_reduce(x)  # (..., out): every rank's partial, summed

    @staticmethod
    def backward(fctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Keeps a column slice of ``weight``: the whole input in (through f), a slice of the features out."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.weight = nn.Parameter(shard_columns(weight, tpg.tp)[tpg.index].clone())  # (out / tp, in)
        self.bias = None if bias is None else nn.Parameter(shard_columns(bias, tpg.tp)[tpg.index].clone())

    def local(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)  # (..., out / tp): no communication

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(CopyToParallelRegion.apply(x, self.tpg))


class RowParallelLinear(nn.Module):
    """Keeps a row slice of ``weight``: a slice of the features in, the whole output out (through g)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.weight = nn.Parameter(shard_rows(weight, tpg.tp)[tpg.index].clone())  # (out, in / tp)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())  # (out,), whole

    def partial(self, x_shard: torch.Tensor) -> torch.Tensor:
        return F.linear(x_shard, self.weight)  # (..., out): this rank's share of the sum

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        out = ReduceFromParallelRegion.apply(self.partial(x_shard), self.tpg)
        return out if self.bias is None else out + self.bias  # the bias once, after the sum


def _split(weight: torch.Tensor, n_shards: int, dim: int, what: str) -> list[torch.Tensor]:
    n_shards = whole_number(n_shards, "n_shards")
    if weight.dim() != 2 and not (dim == 0 and weight.dim() == 1):
        raise ValueError(f"expected an (out, in) weight matrix, got shape {tuple(weight.shape)}")
    size = weight.shape[dim]
    if size % n_shards:
        raise ValueError(f"{size} {what} cannot be split {n_shards} ways: each shard needs an equal, whole "
                         f"number of them ({size} / {n_shards} = {size / n_shards:g})")
    return list(weight.chunk(n_shards, dim=dim))


ROW_PARALLEL = ("o", "down")  # the weights cut along their inputs (dim 1); every other one along its outputs (dim 0)


def shard_columns(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """An ``(out, in)`` weight (or an ``(out,)`` bias) cut along its outputs: the first matrix of a pair (q,
    k, v; gate, up). Each device computes ``out / n`` whole features from the whole input, alone."""
    return _split(weight, n_shards, 0, "output features")


def shard_rows(weight: torch.Tensor, n_shards: int) -> list[torch.Tensor]:
    """An ``(out, in)`` weight cut along its inputs: the second matrix of a pair (o; down). Each device
    computes a partial output over all ``out`` features; their sum is the pair's all-reduce."""
    return _split(weight, n_shards, 1, "input features")
