"""Where ranks compute and how they talk, given the GPUs a machine has: ``place_ranks`` -> ``Placement``;
and how many ranks a machine allows (``check_world_size``: four per CPU core, at least 8).

* ``"nccl"``: one GPU per rank, collectives GPU to GPU (NCCL refuses two ranks on one GPU).
* ``"cuda:gloo"``: rank ``r`` computes on ``cuda:(r % n_gpus)``, shared when GPUs are fewer than ranks, and
  talks through host memory with gloo (its times are host memory's, never a GPU link's, and said so).
* ``"gloo"``: CPU only, collectives through loopback sockets.
* ``"auto"``: nccl with enough GPUs, cuda:gloo with fewer, gloo with none.

Pure: no torch. The GPU count is an argument, so every branch is tested on a machine without one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shardlib.core.checks import whole_number

BACKENDS = ("auto", "gloo", "cuda:gloo", "nccl")


@dataclass(frozen=True)
class Placement:
    """Ranks on devices: ``backend`` (``"gloo"`` or ``"nccl"``, what ``init_process_group`` gets) and
    ``devices`` (one per rank: ``"cpu"`` or ``"cuda:i"``)."""

    backend: str
    devices: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.backend not in ("gloo", "nccl"):
            raise ValueError(f"a placement's backend is 'gloo' or 'nccl', got {self.backend!r}")
        if self.backend == "nccl" and len(set(self.devices)) != len(self.devices):
            raise ValueError(f"NCCL needs one GPU per rank, but devices {list(self.devices)} repeat")

    @property
    def host_staged(self) -> bool:
        """GPU tensors, gloo collectives: every collective goes through host memory."""
        return self.backend == "gloo" and any(d.startswith("cuda") for d in self.devices)

    @property
    def choice(self) -> str:
        """The ``backend=`` value that asks for this placement explicitly."""
        return "cuda:gloo" if self.host_staged else self.backend

    @property
    def label(self) -> str:
        """Where the ranks compute and how their collectives travel, in a few words (figure titles); the
        GPUs compactly: ``"cuda:0"``, ``"cuda:0-3"``, ``"cuda:0, cuda:2"``."""
        ids = sorted({int(d.split(":")[1]) for d in self.devices if d.startswith("cuda")})
        if not ids:
            return "compute on CPU, collectives through loopback sockets (gloo)"
        run = len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1))
        gpus = f"cuda:{ids[0]}-{ids[-1]}" if run else ", ".join(f"cuda:{i}" for i in ids)
        if self.backend == "nccl":
            return f"compute on {gpus}, one GPU per rank, collectives by NCCL"
        shared = f", shared by {len(self.devices)} ranks" if len(ids) < len(self.devices) else ""
        return f"compute on {gpus}{shared}, collectives through host memory (gloo)"


def place_ranks(backend: str, world_size: int, n_gpus: int) -> Placement:
    """The placement of ``world_size`` ranks on a machine with ``n_gpus`` GPUs (see the module
    docstring). A choice that cannot work raises ``ValueError`` naming the GPU count, before anything
    starts."""
    world_size = whole_number(world_size, "world_size (the number of ranks)")
    n_gpus = whole_number(n_gpus, "the number of GPUs", 0)
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}: use 'auto', 'gloo' (CPU), 'cuda:gloo' (compute on the GPUs, "
                         "collectives through host memory) or 'nccl' (one GPU per rank)")
    if backend == "auto":
        backend = "nccl" if n_gpus >= world_size else "cuda:gloo" if n_gpus else "gloo"
    gpus = f"{n_gpus} GPU{'s' if n_gpus != 1 else ''}"
    if backend == "nccl":
        if n_gpus < world_size:
            shared = " or 'cuda:gloo' (ranks share the GPUs, collectives through host memory)" if n_gpus else ""
            raise ValueError(f"backend='nccl' needs one GPU per rank: {world_size} ranks but this machine has {gpus} "
                             f"that torch can use (NCCL refuses two ranks on one GPU); use backend='auto'{shared} "
                             "or 'gloo' (CPU)")
        return Placement("nccl", tuple(f"cuda:{r}" for r in range(world_size)))
    if backend == "cuda:gloo":
        if not n_gpus:
            raise ValueError(f"backend='cuda:gloo' computes on GPUs, but this machine has {gpus} that torch can use; "
                             "use backend='gloo' (CPU) or 'auto'")
        return Placement("gloo", tuple(f"cuda:{r % n_gpus}" for r in range(world_size)))
    return Placement("gloo", ("cpu",) * world_size)


def check_world_size(world_size) -> int:
    """``world_size`` if this machine allows that many ranks: four per CPU core, and at least 8."""
    world_size = whole_number(world_size, "world_size (the number of ranks, like 2 or 4)")
    most = max(8, 4 * (os.cpu_count() or 1))
    if world_size > most:
        raise ValueError(
            f"{world_size} ranks is far beyond this machine ({os.cpu_count()} CPU cores): each rank is a "
            f"whole Python process with its own copy of torch; use at most {most}"
        )
    return world_size
