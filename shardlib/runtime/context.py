"""``RankContext``: what a rank function receives as ``ctx``.

A rank function is any function ``fn(ctx, *args, **kwargs)``. It finds out who it is from ``ctx.rank``
and ``ctx.world_size``, puts its tensors on ``ctx.device``, talks to the other ranks through
``ctx.comm`` (recorded collectives), reads the clock with ``ctx.now_s()`` and marks what it is doing with
``ctx.timeline``. The same function runs on a warm ``Ranks`` pool in a notebook and under ``torchrun``
(``RankContext.from_env()``), on one machine or across nodes with NCCL.

Ranks are placed by ``devices.place_ranks``; on a GPU ``prepare_device`` turns TF32 off (the exactness
checks compare float32 with float32) and ``ctx.sync`` makes a span cover the work, not its launch.
``ctx.group(ranks, process_group)``, a ``RankGroup``, is some ranks as a job of their own: a mechanism
written for ``ctx`` (the buckets, ZeRO-3, the ring, the pipeline's links) runs on it as it is.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from math import prod
from typing import Sequence

import torch
import torch.distributed as dist

from shardlib.runtime.comm import Comm
from shardlib.runtime.devices import place_ranks
from shardlib.runtime.timeline import Timeline, now_s


class RankContext:
    """One rank's view of the job: identity, device, recorded collectives, timeline."""

    def __init__(self, rank: int, world_size: int, device: torch.device, backend: str) -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.backend = backend
        self.timeline = Timeline(rank, sync=self.sync if device.type == "cuda" else None)
        self.comm = Comm(self)
        self._meshes: dict = {}

    def sync(self) -> None:
        """Wait for the work queued on this rank's GPU (nothing to wait for on CPU). Read a clock after
        this, not before, when you time GPU work yourself."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    now_s = staticmethod(now_s)  # this rank's clock (``timeline.now_s``): the serving engine admits requests by it

    @staticmethod
    def wait_s(seconds: float) -> None:
        """Sleep ``seconds`` (nothing if not positive): an idle engine waits for the next arrival."""
        time.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return (f"RankContext(rank={self.rank}, world_size={self.world_size}, device={self.device}, "
                f"backend={self.backend!r})")

    def group(self, ranks: Sequence[int], process_group) -> "RankGroup":
        """The ranks ``ranks`` (this one among them), whose process group is ``process_group``, as a job of
        their own (``RankGroup``). The whole job is ``ctx`` itself."""
        return RankGroup(self, ranks, process_group)

    def new_group(self, ranks: Sequence[int], name: str) -> dist.ProcessGroup:
        """A process group over ``ranks``, logged as ``name`` in the comm log.

        Like ``torch.distributed.new_group``, every rank of the job must call it with the same
        arguments, members or not.
        """
        ranks = sorted(int(r) for r in ranks)
        bad = [r for r in ranks if not 0 <= r < self.world_size]
        if bad:
            raise ValueError(f"group {name!r} names ranks {bad}, outside 0..{self.world_size - 1}")
        group = dist.new_group(ranks)
        if self.rank in ranks:
            self.comm.name_group(group, name)
        return group

    def device_mesh(self, shape: Sequence[int], names: Sequence[str]):
        """A torch ``DeviceMesh`` of ``shape`` over every rank of the job (rank = row-major index into
        ``shape``, the last axis innermost), with one process group per axis, each logged in the comm log
        under its axis name (``"tp"``, ``"pp"`` ...).

        Made once per (shape, names) and kept on this context, so a warm pool builds its groups on the
        first call and reuses them after. Like ``new_group``, every rank must call it with the same
        arguments.
        """
        key = (tuple(int(s) for s in shape), tuple(str(n) for n in names))
        if key not in self._meshes:
            if len(key[0]) != len(key[1]):
                raise ValueError(f"a mesh of shape {key[0]} needs {len(key[0])} axis names, got {key[1]}")
            if prod(key[0]) != self.world_size:
                raise ValueError(f"a mesh of shape {' x '.join(map(str, key[0]))} = {prod(key[0])} ranks, but the "
                                 f"job has world_size = {self.world_size}: the mesh must multiply to the world size")
            from torch.distributed.device_mesh import init_device_mesh

            self._meshes[key] = init_device_mesh(self.device.type, key[0], mesh_dim_names=key[1])
        mesh = self._meshes[key]
        for name in key[1]:  # again on every call: two meshes may share one group (the same ranks) under
            self.comm.name_group(mesh.get_group(name), name)  # different names, and this call's name is meant
        return mesh

    @classmethod
    def from_env(cls, backend: str = "auto", timeout_s: float = 600.0) -> "RankContext":
        """The context of a process started by ``torchrun`` (reads RANK, WORLD_SIZE, LOCAL_RANK ...).

        Initialises the default process group if nobody has yet, placing this machine's
        ``LOCAL_WORLD_SIZE`` ranks as ``devices.place_ranks`` does (``backend="auto"``: NCCL with one GPU
        per local rank when there are enough GPUs, GPUs shared with gloo through host memory when there
        are fewer, gloo on CPU when there are none).
        """
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing and not dist.is_initialized():
            raise RuntimeError(
                f"RankContext.from_env() needs the variables torchrun sets ({', '.join(missing)} missing); "
                "start the script with `torchrun --nproc-per-node N script.py`, or use shardlib.Ranks "
                "in a notebook"
            )
        rank = int(os.environ.get("RANK", dist.get_rank() if dist.is_initialized() else 0))
        world_size = int(os.environ.get("WORLD_SIZE", dist.get_world_size() if dist.is_initialized() else 1))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if dist.is_initialized():  # someone else set the job up: follow what they chose
            backend = dist.get_backend()
            return cls(rank, world_size, prepare_device(f"cuda:{local_rank}" if backend == "nccl" else "cpu"), backend)
        placement = place_ranks(backend, local_world, gpu_count())  # this machine's share of the ranks
        if placement.backend == "gloo" and os.environ["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
            use_loopback_for_gloo()  # every rank is on this machine
        device = prepare_device(placement.devices[local_rank])
        dist.init_process_group(placement.backend, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout_s))
        return cls(rank, world_size, device, placement.backend)


class RankGroup:
    """Some of the job's ranks as a job of their own: ``rank`` (this rank's place in ``ranks``),
    ``world_size``, ``device``, and ``comm`` (the group itself) whose calls take places in the group and go
    through the recorded ``ctx.comm`` on ``process_group``. Made by ``ctx.group``."""

    def __init__(self, ctx: RankContext, ranks: Sequence[int], process_group) -> None:
        self.ctx, self.ranks, self.process_group = ctx, [int(r) for r in ranks], process_group
        if ctx.rank not in self.ranks:
            raise ValueError(f"rank {ctx.rank} is not in the group {self.ranks} it was asked to join")
        self.rank, self.world_size, self.device = self.ranks.index(ctx.rank), len(self.ranks), ctx.device
        self.comm = self  # the group's calls, by place in the group

    def __repr__(self) -> str:
        return f"RankGroup(ranks={self.ranks}, rank={self.rank}, name={self.ctx.comm.group_name(self.process_group)!r})"

    def all_reduce(self, tensor, op="sum", async_op=False):
        return self.ctx.comm.all_reduce(tensor, op, group=self.process_group, async_op=async_op)

    def all_gather(self, tensor, dim=0, async_op=False):
        return self.ctx.comm.all_gather(tensor, dim, group=self.process_group, async_op=async_op)

    def reduce_scatter(self, tensor, op="sum", dim=0, async_op=False):
        return self.ctx.comm.reduce_scatter(tensor, op, dim, group=self.process_group, async_op=async_op)

    def broadcast(self, tensor, src: int = 0):  # src: a place in the group
        return self.ctx.comm.broadcast(tensor, self.ranks[src], group=self.process_group)

    def barrier(self):
        return self.ctx.comm.barrier(group=self.process_group)

    def send(self, tensor, dst: int):  # dst, src: places in the group
        return self.ctx.comm.send(tensor, self.ranks[dst], group=self.process_group)

    def recv(self, tensor, src: int):
        return self.ctx.comm.recv(tensor, self.ranks[src], group=self.process_group)

    def isend(self, tensor, dst: int):
        return self.ctx.comm.isend(tensor, self.ranks[dst], group=self.process_group)

    def irecv(self, tensor, src: int):
        return self.ctx.comm.irecv(tensor, self.ranks[src], group=self.process_group)


def gpu_count() -> int:
    """GPUs torch can use here (0 on a CPU build), without initialising CUDA."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def prepare_device(device: str) -> torch.device:
    """Make ``device`` this process's device. On a GPU: select it, and turn TF32 off for matmuls and
    convolutions (``allow_tf32 = False``, float32 matmul precision ``"highest"``), so float32 stays
    float32: the exactness checks compare float32 with float32, never with a 10-bit mantissa."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    return device


def use_loopback_for_gloo() -> None:
    """Make gloo bind its sockets to the loopback interface ('lo' on Linux, 'lo0' on macOS and BSD),
    unless the user chose one."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo" if sys.platform.startswith("linux") else "lo0")
