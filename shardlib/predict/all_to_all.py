"""What one expert-parallel all-to-all costs on a cluster, with node-limited routing (DeepSeek-V3's).

A token's ``k`` rows go to the ranks holding its experts (GShard). Once an expert group's ``ep`` ranks span
nodes, the rows that leave a node cross the slower link. DeepSeek-V3 (arXiv 2412.19437, sections 2.1.2 and
3.2.2) bounds that: each token's experts lie in at most ``M = 4`` nodes, the token crosses InfiniBand once
per node it reaches and NVLink forwards it there; the two legs overlap. Priced by alpha-beta
(``predict.alpha_beta``), per rank, for ``tokens`` home tokens:

* inside one node: a plain all-to-all of ``tokens x k`` rows over the ``ep`` ranks on the node's link;
* across ``N`` nodes, unlimited (``node_limit = 0``): the same all-to-all at the network's rate;
* across ``N`` nodes, limited to ``M``: ``min(k, M, N)`` copies a token over the network, ``(N - 1)/N`` of
  them to other nodes (an all-to-all over the ``N`` nodes), and ``k`` rows forwarded over NVLink among the
  group's ``ep / N`` ranks of a node; the slower leg sets the time.

Uniform routing is assumed (no load imbalance). Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import number_at_least, whole_number
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import collective_time_s

DEEPSEEK_V3_NODE_LIMIT = 4  # "each token will be sent to at most M = 4 nodes" (section 2.1.2)


def ep_group_nodes(ep: int, gpus_per_node: int) -> int:
    """Nodes one group of ``ep`` consecutive ranks spans (groups start at multiples of ``ep``): 1 when
    ``ep`` divides a node, ``ep / g`` when nodes divide the group, else it straddles one more."""
    ep, g = whole_number(ep, "ep"), whole_number(gpus_per_node, "gpus_per_node")
    if g % ep == 0:
        return 1
    if ep % g == 0:
        return ep // g
    return -(-ep // g) + 1


@dataclass(frozen=True)
class ExpertAllToAll:
    """One dispatch (or combine) on one rank: the rows it sends per token over each link, the bytes, the
    seconds of each leg and in all."""

    ep: int
    nodes: int
    node_limit: int  # 0: unlimited
    network_rows_per_token: float  # rows a token sends to other nodes
    node_rows_per_token: float  # rows a token sends to other ranks of its node
    network_bytes: float  # per rank
    node_bytes: float  # per rank
    network_s: float
    node_s: float

    @property
    def seconds(self) -> float:
        """The slower leg: the network and NVLink legs overlap (DeepSeek-V3 section 3.2.2)."""
        return max(self.network_s, self.node_s)


def expert_all_to_all(tokens: float, d_model: int, k: int, ep: int, nodes: int, intra_link: Link,
                      inter_link: Link, bytes_per_value: float = 2.0, node_limit: int = 0,
                      latency_charge: str = "per_step") -> ExpertAllToAll:
    """One all-to-all of ``tokens`` home tokens' ``k`` rows of ``d_model`` values over an expert group of
    ``ep`` ranks on ``nodes`` nodes (``ep_group_nodes``; the module docstring's three cases)."""
    number_at_least(tokens, "tokens (home tokens of one rank)")
    whole_number(k, "k (experts per token)")
    whole_number(ep, "ep (ranks the experts are spread over)")
    whole_number(nodes, "nodes (that the expert group spans)")
    whole_number(node_limit, "node_limit (0: unlimited)", minimum=0)
    row = d_model * bytes_per_value
    size = tokens * k * row  # what the rank puts into the all-to-all
    if ep == 1:
        return ExpertAllToAll(1, 1, node_limit, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    if nodes == 1:
        s = collective_time_s("all_to_all", size, ep, intra_link, latency_charge)
        rows = k * (ep - 1) / ep
        return ExpertAllToAll(ep, 1, node_limit, 0.0, rows, 0.0, tokens * rows * row, 0.0, s)
    if not node_limit:
        s = collective_time_s("all_to_all", size, ep, inter_link, latency_charge)
        rows = k * (ep - 1) / ep
        return ExpertAllToAll(ep, nodes, 0, rows, 0.0, tokens * rows * row, 0.0, s, 0.0)
    reached = min(k, node_limit, nodes)  # nodes a token reaches, one network copy each
    per_node = max(ep // nodes, 1)  # the group's ranks on one node
    network = collective_time_s("all_to_all", tokens * reached * row, nodes, inter_link, latency_charge)
    node = collective_time_s("all_to_all", size, per_node, intra_link, latency_charge) if per_node > 1 else 0.0
    net_rows, node_rows = reached * (nodes - 1) / nodes, k * (per_node - 1) / per_node
    return ExpertAllToAll(ep, nodes, node_limit, net_rows, node_rows, tokens * net_rows * row,
                          tokens * node_rows * row, network, node)
