"""The one mesh: ``Layout(tp, pp, dp, ep)``, how it numbers ranks, and the groups along each axis.

``world_size = tp x pp x dp``: ``dp`` replicas, each a pipeline of ``pp`` stages (GPipe, Huang et al.
2019), each stage split ``tp`` ways inside its layers (Megatron-LM, Shoeybi et al. 2019). Ranks are
numbered tp innermost and pp outermost, as Megatron-LM orders its groups, so a tensor-parallel group is
``tp`` consecutive ranks (inside one node whenever ``tp`` divides the GPUs per node)::

    rank = (stage * dp + replica) * tp + tp_rank      # a (pp, dp, tp) array, tp varying fastest

``ep`` (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021) is not a fourth factor: it counts the
ranks of one stage (its ``tp x dp``) the experts of each MoE layer are spread over, so it divides
``tp x dp``. On ranks, ``RankContext.device_mesh(layout.mesh_shape, layout.mesh_axes)`` builds the torch
``DeviceMesh`` of the same numbering. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import whole_number


@dataclass(frozen=True)
class Layout:
    """``tp`` x ``pp`` x ``dp`` ranks, with experts spread over ``ep`` ranks of each stage."""

    tp: int
    pp: int
    dp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep"):
            whole_number(getattr(self, name), name)

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        return f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" ep={self.ep}" if self.ep > 1 else "")

    mesh_axes = ("pp", "dp", "tp")  # outermost first: the order of ``mesh_shape`` and of a DeviceMesh

    @property
    def mesh_shape(self) -> tuple[int, int, int]:
        return self.pp, self.dp, self.tp

    def rank(self, stage: int, replica: int, tp_rank: int) -> int:
        return (stage * self.dp + replica) * self.tp + tp_rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(stage, replica, tp_rank)`` of ``rank``."""
        block, tp_rank = divmod(rank, self.tp)
        stage, replica = divmod(block, self.dp)
        return stage, replica, tp_rank

    def tp_groups(self) -> list[list[int]]:
        """The ranks of each tensor-parallel group: one per (stage, replica)."""
        return [[self.rank(s, d, t) for t in range(self.tp)] for s in range(self.pp) for d in range(self.dp)]

    def pp_groups(self) -> list[list[int]]:
        """The ranks of each pipeline: one per (replica, tp rank), stage by stage."""
        return [[self.rank(s, d, t) for s in range(self.pp)] for d in range(self.dp) for t in range(self.tp)]

    def dp_groups(self) -> list[list[int]]:
        """The ranks holding the same slice of the same stage in each replica."""
        return [[self.rank(s, d, t) for d in range(self.dp)] for s in range(self.pp) for t in range(self.tp)]

    def ep_groups(self) -> list[list[int]]:
        """The ranks each MoE layer's experts are spread over: ``ep`` consecutive ranks of a stage."""
        per_stage = self.tp * self.dp
        return [[s * per_stage + j * self.ep + i for i in range(self.ep)]
                for s in range(self.pp) for j in range(per_stage // self.ep)]


def check_mesh(layout: Layout, n_gpus: int, what: str = "GPUs") -> None:
    """A layout must use every device exactly once: ValueError with the arithmetic otherwise."""
    if layout.world_size != n_gpus:
        raise ValueError(f"tp x pp x dp = {layout.tp} x {layout.pp} x {layout.dp} = {layout.world_size}, but there "
                         f"are {n_gpus} {what}: the mesh must multiply to the number of {what}")
