"""The one mesh: ``Layout(tp, pp, dp, ep, cp, dp_strategy)``, how it numbers ranks, the groups per axis.

``world_size = tp x pp x dp x cp``: ``dp`` replicas, each a pipeline of ``pp`` stages (GPipe, Huang et
al. 2019), its tokens split ``cp`` ways (ring attention) and its layers ``tp`` ways (Megatron-LM). Ranks
are numbered in Megatron-LM's order, ``tp-cp-dp-pp`` innermost first: the chattiest axis innermost, so
a tp group is ``tp`` consecutive ranks (one node whenever ``tp`` divides its GPUs), the pipeline's small
point-to-point traffic outermost::

    rank = ((stage * dp + replica) * cp + cp_rank) * tp + tp_rank   # a (pp, dp, cp, tp) array

``ep`` (GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021) is not a fourth factor: it counts the
ranks of one stage (its ``tp x dp``) the experts of each MoE layer are spread over, so it divides
``tp x dp``. ``dp_strategy``: DDP or ZeRO-1/2/3 (training only). ``RankContext.device_mesh(layout.mesh_shape,
layout.mesh_axes)`` builds the torch ``DeviceMesh`` of the same numbering. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from shardlib.core.checks import choice, whole_number

DP_STRATEGIES = ("ddp", "zero1", "zero2", "zero3")  # how data-parallel replicas keep weights, grads, optimizer


class MeshPosition(NamedTuple):
    """Where a rank sits on the mesh: its pipeline stage, replica, place in the ring and in the tp group."""

    stage: int
    replica: int
    cp_rank: int
    tp_rank: int


@dataclass(frozen=True)
class Layout:
    """``tp`` x ``pp`` x ``dp`` x ``cp`` ranks, experts spread over ``ep`` ranks of each stage, the replicas'
    state kept by ``dp_strategy``."""

    tp: int
    pp: int
    dp: int = 1
    ep: int = 1
    cp: int = 1
    dp_strategy: str = "ddp"

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp", "ep", "cp"):
            whole_number(getattr(self, name), name)
        choice(self.dp_strategy, DP_STRATEGIES, "dp_strategy (how data-parallel replicas keep their state)")

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    @property
    def label(self) -> str:
        return (f"tp={self.tp} pp={self.pp} dp={self.dp}" + (f" cp={self.cp}" if self.cp > 1 else "")
                + (f" ep={self.ep}" if self.ep > 1 else "")
                + (f" {self.dp_strategy}" if self.dp_strategy != "ddp" else ""))

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        """Outermost first: the order of ``mesh_shape`` and of a DeviceMesh (``cp`` only when split)."""
        return ("pp", "dp", "cp", "tp") if self.cp > 1 else ("pp", "dp", "tp")

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp, self.cp, self.tp) if self.cp > 1 else (self.pp, self.dp, self.tp)

    def rank(self, stage: int, replica: int, tp_rank: int, cp_rank: int = 0) -> int:
        return ((stage * self.dp + replica) * self.cp + cp_rank) * self.tp + tp_rank

    def position(self, rank: int) -> MeshPosition:
        """``(stage, replica, cp_rank, tp_rank)`` of ``rank``."""
        block, tp_rank = divmod(rank, self.tp)
        block, cp_rank = divmod(block, self.cp)
        stage, replica = divmod(block, self.dp)
        return MeshPosition(stage, replica, cp_rank, tp_rank)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(stage, replica, tp_rank)`` of ``rank`` in a layout without context parallelism."""
        if self.cp > 1:
            raise ValueError(f"{self.label} has {self.cp} context-parallel ranks per replica: use position(rank), "
                             "which also gives the rank's place in the ring")
        p = self.position(rank)
        return p.stage, p.replica, p.tp_rank

    def _groups(self, *axes: str) -> list[list[int]]:
        """The ranks that differ only along ``axes``, one list per fixed place on the other axes."""
        lines: dict[tuple, list[int]] = {}
        for r in range(self.world_size):
            p = dict(zip(("pp", "dp", "cp", "tp"), self.position(r)))
            lines.setdefault(tuple(v for k, v in p.items() if k not in axes), []).append(r)
        return list(lines.values())

    def tp_groups(self) -> list[list[int]]:
        """The ranks of each tensor-parallel group: one per (stage, replica, cp rank)."""
        return self._groups("tp")

    def cp_groups(self) -> list[list[int]]:
        """The ranks of each context-parallel ring: one per (stage, replica, tp rank)."""
        return self._groups("cp")

    def pp_groups(self) -> list[list[int]]:
        """The ranks of each pipeline: one per (replica, cp rank, tp rank), stage by stage."""
        return self._groups("pp")

    def dp_groups(self) -> list[list[int]]:
        """The ranks holding the same slice of the same stage in each replica."""
        return self._groups("dp")

    def dp_cp_groups(self) -> list[list[int]]:
        """The ranks holding the same weights of a stage: every replica and every place in the ring (the
        gradients of weights replicated over ``dp x cp`` are summed over both)."""
        return self._groups("dp", "cp")

    def ep_groups(self) -> list[list[int]]:
        """The ranks each MoE layer's experts are spread over: ``ep`` consecutive ranks of a stage."""
        per_stage = self.tp * self.dp * self.cp
        return [[s * per_stage + j * self.ep + i for i in range(self.ep)]
                for s in range(self.pp) for j in range(per_stage // self.ep)]

    def expert_dp_groups(self) -> list[list[int]]:
        """The ranks of a stage holding the same experts (expert data parallelism): one place of each ep
        group, ``ep`` ranks apart; their experts' gradients are summed over this group."""
        per_stage = self.tp * self.dp * self.cp
        return [[s * per_stage + j * self.ep + i for j in range(per_stage // self.ep)]
                for s in range(self.pp) for i in range(self.ep)]

    def stage_groups(self) -> list[list[int]]:
        """Every rank of each stage: what a weight replicated over tp, dp and cp (an MoE router under
        sequence parallelism) sums its gradient over."""
        return self._groups("dp", "cp", "tp")


def check_mesh(layout: Layout, n_gpus: int, what: str = "GPUs") -> None:
    """A layout must use every device exactly once: ValueError with the arithmetic otherwise."""
    if layout.world_size != n_gpus:
        names, values = ("tp x pp x dp x cp", f" x {layout.cp}") if layout.cp > 1 else ("tp x pp x dp", "")
        raise ValueError(f"{names} = {layout.tp} x {layout.pp} x {layout.dp}{values} = "
                         f"{layout.world_size}, but there are {n_gpus} {what}: the mesh must multiply to the "
                         f"number of {what}")


@dataclass(frozen=True)
class Rejected:
    """A layout a planner refused, with its reasons in words (the numbers included)."""

    layout: Layout
    reasons: tuple[str, ...]
