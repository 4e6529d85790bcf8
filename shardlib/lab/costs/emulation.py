"""A slower link between "nodes" of one machine, emulated: the toy cluster's network, made measurable.

Every rank of a notebook's pool talks over the same loopback, so "tensor parallelism inside a node,
pipeline stages across nodes" cannot be told apart from any other layout by measuring alone. An
``EmulatedLink`` gives the ranks nodes (``node_of_rank``) and a link between them (``link``, a
``hardware.Link``): a call whose ranks sit on more than one node lasts at least as long as the
alpha-beta model (``predict.alpha_beta``) says it would over that link, counted from the moment the last
of its ranks arrived (for a send, from the sender's start, on the receiver's side), and is marked
``emulated`` in the comm log and on the timeline (``runtime.comm`` does the holding). Calls inside a
node are untouched. The bytes are real; only the time of the slow link is imposed, and every figure
that uses it says so. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import choice, whole_number
from shardlib.facts.hardware import LATENCY_CHARGES, Cluster, Link
from shardlib.predict.alpha_beta import collective_time_s

# the comm log's op names, and the alpha-beta formula each is priced with
FORMULAS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
            "all_to_all_single": "all_to_all", "send": "point_to_point", "recv": "point_to_point",
            "broadcast": "point_to_point", "barrier": "all_reduce"}


@dataclass(frozen=True)
class EmulatedLink:
    """Ranks on nodes, and the link that joins the nodes (see the module docstring)."""

    node_of_rank: tuple[int, ...]
    link: Link
    latency_charge: str = "per_step"

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_of_rank", tuple(whole_number(n, "a node number", 0) for n in self.node_of_rank))
        if not isinstance(self.link, Link):
            raise ValueError(f"link must be a hardware.Link, got {self.link!r}")
        choice(self.latency_charge, LATENCY_CHARGES, "latency_charge")

    @classmethod
    def of_cluster(cls, cluster: Cluster) -> "EmulatedLink":
        """The cluster's nodes (``cluster.node_of``) joined by its ``inter_link``, priced as it prices them."""
        return cls(tuple(cluster.node_of(r) for r in range(cluster.n_gpus)), cluster.inter_link, cluster.latency_charge)

    @property
    def label(self) -> str:
        return f"emulated {self.link.name} between nodes"

    def crosses(self, ranks) -> bool:
        """Whether ``ranks`` (global rank numbers) sit on more than one node."""
        return len({self.node_of_rank[r] for r in ranks}) > 1

    def time_s(self, op: str, size_bytes: int, n: int) -> float:
        """How long ``op`` on ``size_bytes`` over ``n`` ranks takes over the emulated link."""
        return collective_time_s(FORMULAS[op], max(size_bytes, 1), n, self.link, self.latency_charge)
