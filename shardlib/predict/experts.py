"""Expert parallelism's formulas: all-to-all bytes, the share of rows that leave home, weight bytes per rank,
and what one all-to-all costs on a cluster with node-limited routing.

GShard (Lepikhin et al. 2020) and Switch Transformer (Fedus et al. 2021): every token sends ``k`` rows of
``d_model`` values out in the dispatch and receives as many back in the combine; each rank holds its whole
experts' weights. Notebook 04 sets each formula beside the bytes the ranks logged.

``expert_all_to_all`` prices one all-to-all per rank in two legs, each on its own link: the rows that cross
to other nodes at the network's rate, the rows for other GPUs of the node at NVLink's; the two legs run at
once, so the slower sets the time (DeepSeek-V3, arXiv 2412.19437, section 3.2.2). Pure: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardlib.core.checks import number_at_least, whole_number
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import collective_time_s

if TYPE_CHECKING:
    from shardlib.core.experts.placement import ExpertPlacement
    from shardlib.core.experts.routing import MoEConfig

BYTES_PER_VALUE = 4  # float32 rows


def predicted_weight_bytes(placement: ExpertPlacement, cfg: MoEConfig) -> list[int]:
    """Expert weight bytes each rank must hold: its ``n_experts / ep`` experts and any replica, each three
    ``d_model x d_ff`` matrices (gate, up, down). A replica's price is one more expert on its rank:
    ``3 d_model d_ff`` values."""
    one_expert = 3 * cfg.d_model * cfg.d_ff * BYTES_PER_VALUE
    return [len(placement.hosted(r)) * one_expert for r in range(placement.ep)]


def predicted_all_to_all_bytes(n_tokens: int, k: int, d_model: int) -> int:
    """Bytes of token rows one dispatch (and, the same again, one combine) puts into its all-to-all,
    summed over ranks: every token sends ``k`` rows of ``d_model`` values, rows a rank keeps for
    itself included (``comm.py`` counts the input buffer). Fewer when a capacity cap drops slots."""
    return n_tokens * k * d_model * BYTES_PER_VALUE


def predicted_cross_rank_share(world_size: int) -> float:
    """Share of dispatched rows that leave their home rank when routing is uniform: ``(w - 1) / w``."""
    return (world_size - 1) / world_size


def predicted_exposed_s(counts_s: list[float], rows_s: list[float], expert_s: float, overlap: bool) -> float:
    """Seconds a rank is blocked in the all-to-alls of two microbatches A and B through the layer
    (``dispatch.moe_two_microbatches``). ``counts_s``: the two counts exchanges (always exposed);
    ``rows_s``: A's dispatch, B's dispatch, A's combine, B's combine, each priced by the alpha-beta model;
    ``expert_s``: one microbatch's expert phase. A then B: every one exposed. Overlapped: A's dispatch and
    B's combine exposed, B's dispatch hidden under A's experts and A's combine under B's, but for what
    sticks out past them."""
    dispatch_a, dispatch_b, combine_a, combine_b = rows_s
    if not overlap:
        return sum(counts_s) + sum(rows_s)
    return (sum(counts_s) + dispatch_a + max(0.0, dispatch_b - expert_s) + max(0.0, combine_a - expert_s)
            + combine_b)


def predicted_moe_step_bytes(n_experts: int, d_model: int, d_ff: int, d_in: int, ep: int, world_size: int,
                             rows_to: int, rows_from: int) -> dict[tuple[str, str], int]:
    """Buffer bytes one rank puts into each (op, group) in one MoE training step (``lab.experts.training``), as
    the comm log counts them: on ``"ep"``, the counts (int64) and four all-to-alls of rows, the dispatch
    (``rows_to`` rows out) and the combine (``rows_from`` back) in the forward, the same two reversed in
    the backward; on ``"world"``, the dense gradients (``w_in``, the router), the loss pair and the counts;
    on ``"edp"``, this rank's experts' gradients (only when ``world_size > ep``). The toy trains in float64."""
    value = 8  # bytes: float64 weights and rows, and the int64 counts
    row = d_model * value
    out = {("all_to_all_single", "ep"): n_experts * value + 2 * (rows_to + rows_from) * row,
           ("all_reduce", "world"): (d_model * d_in + n_experts * d_model + 2 + n_experts) * value}
    if world_size > ep:
        out[("all_reduce", "edp")] = 3 * (n_experts // ep) * d_ff * d_model * value
    return out


# -- one all-to-all on a cluster ---------------------------------------------------------------------------
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
    network_rows_per_token: float  # rows (or node copies) a token sends to other nodes
    node_rows_per_token: float  # rows a token sends to other GPUs of a node, over NVLink
    network_bytes: float  # per rank
    node_bytes: float  # per rank
    network_s: float
    node_s: float

    @property
    def seconds(self) -> float:
        """The slower leg: the network and NVLink legs overlap (DeepSeek-V3 section 3.2.2)."""
        return max(self.network_s, self.node_s)


def _leg_s(size_bytes: float, peers: int, link: Link, latency_charge: str) -> float:
    """``size_bytes`` from one rank to ``peers`` others over ``link``: an all-to-all over ``peers + 1``
    ranks of which ``size_bytes`` leave this one (``peers`` latencies, or one ``per_call``)."""
    if not peers:
        return 0.0
    return collective_time_s("all_to_all", size_bytes * (peers + 1) / peers, peers + 1, link, latency_charge)


def expert_all_to_all(tokens: float, d_model: int, k: int, ep: int, nodes: int, intra_link: Link,
                      inter_link: Link, bytes_per_value: float = 2.0, node_limit: int = 0,
                      latency_charge: str = "per_step") -> ExpertAllToAll:
    """One all-to-all of ``tokens`` home tokens' ``k`` rows of ``d_model`` values over an expert group of
    ``ep`` ranks on ``nodes`` nodes (``ep_group_nodes``), ``g = ep / nodes`` on each, routing uniform:

    * inside one node: ``k (ep - 1) / ep`` rows a token over NVLink;
    * across nodes, each row straight to its expert's GPU: ``k (ep - g) / ep`` over the network,
      ``k (g - 1) / ep`` over NVLink, ``k / ep`` stay on the GPU (ep 16 on 2 nodes, k 8: 4, 3.5, 0.5);
    * node-limited, a token's experts on at most ``node_limit`` nodes (DeepSeek-V3, sections 2.1.2 and
      3.2.2: 4): one copy per remote node reached, ``min(k, node_limit, nodes) (nodes - 1) / nodes`` over
      the network, then all ``k`` rows forwarded inside each node, ``k (g - 1) / g`` over NVLink.

    A leg of ``b`` bytes to ``p`` peers costs ``p`` latencies (one, ``per_call``) and ``b`` at its link's rate."""
    number_at_least(tokens, "tokens (home tokens of one rank)")
    whole_number(k, "k (experts per token)")
    whole_number(ep, "ep (ranks the experts are spread over)")
    whole_number(nodes, "nodes (that the expert group spans)")
    whole_number(node_limit, "node_limit (0: unlimited)", minimum=0)
    if ep == 1:
        return ExpertAllToAll(1, 1, node_limit, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    per_node = ep if nodes == 1 else max(ep // nodes, 1)  # g: the group's ranks on one node
    if nodes == 1 or not node_limit:  # every row straight to its expert's GPU
        net_rows, net_peers = k * (ep - per_node) / ep, ep - per_node
        node_rows = k * (per_node - 1) / ep
    else:  # one copy per remote node reached, forwarded inside it
        net_rows, net_peers = min(k, node_limit, nodes) * (nodes - 1) / nodes, nodes - 1
        node_rows = k * (per_node - 1) / per_node
    row = d_model * bytes_per_value
    net_bytes, node_bytes = tokens * net_rows * row, tokens * node_rows * row
    return ExpertAllToAll(ep, nodes, node_limit, net_rows, node_rows, net_bytes, node_bytes,
                          _leg_s(net_bytes, net_peers, inter_link, latency_charge),
                          _leg_s(node_bytes, per_node - 1, intra_link, latency_charge))
