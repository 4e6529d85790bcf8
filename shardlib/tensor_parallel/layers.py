"""Tensor parallelism on a rank: Megatron-LM's f and g, and the two parallel linear layers.

Megatron-LM (Shoeybi et al. 2019, section 3) writes the communication of a column-then-row pair as two
conjugate operators:

* ``f`` (``CopyToParallelRegion``): identity in the forward pass, all-reduce of the gradient in the
  backward pass. It sits where the replicated input enters the column-parallel matrix: each rank's
  slice contributes a partial gradient for the whole input.
* ``g`` (``ReduceFromParallelRegion``): all-reduce in the forward pass, identity backward. It sits after
  the row-parallel matrix, summing the partial outputs.

So a pair costs one all-reduce forward and one backward. The ranks a layer is split over are a
``TPGroup``: the whole job (``TPGroup.world(ctx)``), or one axis of a mesh (``TPGroup.of_mesh``), so
the same layers serve a notebook's 2-rank pool and the tensor axis of a combined layout. Every
collective goes through ``ctx.comm``, so counts and bytes are read from the comm log, not asserted by
hand. Each rank receives the full weights and keeps only its slice; a real deployment loads only the
slice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import whole_number
from .split import shard_columns, shard_rows


@dataclass(frozen=True)
class TPGroup:
    """The ``tp`` ranks one layer is split over, and this rank's place among them (``index``: which
    slice it holds). ``group`` is the process group of the sums (``None``: every rank of the job);
    ``comm`` is ``ctx.comm``, which records them. With no ``comm`` the group is a stand-in for a
    single-process simulation: layers compute their partials, and summing them is the caller's job."""

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

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the group, on a copy (autograd may still need ``tensor``). One rank: itself."""
        if self.tp == 1:
            return tensor
        if self.comm is None:
            raise RuntimeError("a simulated TPGroup has no ranks to sum over: add the partials yourself")
        return self.comm.all_reduce(tensor.contiguous().clone(), group=self.group)


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f: forward identity, backward all-reduce (sum of every rank's input gradient)."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        fctx.tpg = tpg
        return x.view_as(x)

    @staticmethod
    def backward(fctx, grad):
        return fctx.tpg.all_reduce(grad), None


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g: forward all-reduce (sum of the partial outputs), backward identity."""

    @staticmethod
    def forward(fctx, x, tpg: TPGroup):
        return tpg.all_reduce(x)

    @staticmethod
    def backward(fctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Holds one column slice of a weight: whole input in (through f), a slice of the features out."""

    def __init__(self, weight_shard: torch.Tensor, bias_shard: torch.Tensor | None, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.weight = nn.Parameter(weight_shard.detach().clone())  # (out / tp, in)
        self.bias = None if bias_shard is None else nn.Parameter(bias_shard.detach().clone())

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None, tpg: TPGroup) -> "ColumnParallelLinear":
        bias_shard = None if bias is None else shard_columns(bias, tpg.tp)[tpg.index]
        return cls(shard_columns(weight, tpg.tp)[tpg.index], bias_shard, tpg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.tpg)  # (..., in), replicated
        return F.linear(x, self.weight, self.bias)  # (..., out / tp)


class RowParallelLinear(nn.Module):
    """Holds one row slice of a weight: a slice of the features in, the full output out (through g)."""

    def __init__(self, weight_shard: torch.Tensor, bias: torch.Tensor | None, tpg: TPGroup) -> None:
        super().__init__()
        self.tpg = tpg
        self.weight = nn.Parameter(weight_shard.detach().clone())  # (out, in / tp)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())  # (out,), whole

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None, tpg: TPGroup) -> "RowParallelLinear":
        return cls(shard_rows(weight, tpg.tp)[tpg.index], bias, tpg)

    def partial(self, x_shard: torch.Tensor) -> torch.Tensor:
        """This rank's share of the sum, before g. (..., out)"""
        return F.linear(x_shard, self.weight)

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        out = ReduceFromParallelRegion.apply(self.partial(x_shard), self.tpg)
        return out if self.bias is None else out + self.bias  # the bias once, after the sum
