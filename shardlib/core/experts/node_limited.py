"""Node-limited routing (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): each token's experts come
from at most ``M`` nodes, so its cross-node traffic is bounded by ``M`` whatever the router prefers.

The experts sit on ``n_nodes`` nodes in contiguous blocks (expert ``e`` on node ``e // (E / N)``, as the
ranks holding them). For each token, each node is scored by the sum of its ``k // M`` (at least one)
highest selection scores (affinity plus any balancing bias); the token keeps the ``M`` best nodes and
takes its top-k among their experts only. DeepSeek-V3: 256 routed experts on 8 nodes, k = 8, M = 4.
``cross_node_rows`` counts what a dispatch sends off the token's home node (one row per token-slot, or
one per distinct remote node with DeepSeek-V3's dedup, NVLink forwarding the copies inside the node).
``tokens_changed`` is the quality cost: tokens whose chosen experts differ from unlimited routing.
Pure: torch, no ranks.
"""

from __future__ import annotations

import torch

from shardlib.core.checks import whole_number


def check_node_limit(n_experts: int, k: int, n_nodes: int, max_nodes: int | None) -> None:
    """A ValueError in the learner's terms if ``k`` experts cannot be found on ``max_nodes`` of ``n_nodes``."""
    whole_number(n_nodes, "n_nodes (the nodes the experts are spread over)")
    if n_experts % n_nodes:
        raise ValueError(f"{n_experts} experts cannot be spread evenly over {n_nodes} nodes: n_nodes must divide "
                         f"n_experts")
    if max_nodes is None:
        return
    if not isinstance(max_nodes, int) or isinstance(max_nodes, bool) or not 1 <= max_nodes <= n_nodes:
        raise ValueError(f"max_nodes (M, the nodes one token may reach) must be a whole number from 1 to n_nodes = "
                         f"{n_nodes}, got {max_nodes!r}")
    reachable = max_nodes * (n_experts // n_nodes)
    if k > reachable:
        raise ValueError(f"a token limited to {max_nodes} node(s) of {n_experts // n_nodes} experts each can reach "
                         f"only {reachable} experts, fewer than k = {k}: raise max_nodes or lower k")


def node_of_expert(n_experts: int, n_nodes: int) -> torch.Tensor:
    """``(n_experts,)`` the node of each expert: contiguous blocks of ``n_experts / n_nodes``."""
    return torch.arange(n_experts) // (n_experts // n_nodes)


def node_scores(scores: torch.Tensor, n_nodes: int, per_node: int) -> torch.Tensor:
    """``(T, n_nodes)``: for each token, the sum of each node's ``per_node`` highest of ``scores`` ``(T, E)``."""
    grouped = scores.view(scores.shape[0], n_nodes, -1)  # (T, N, E / N)
    return grouped.topk(min(per_node, grouped.shape[2]), dim=-1).values.sum(dim=-1)


def limit_to_nodes(scores: torch.Tensor, k: int, n_nodes: int, max_nodes: int) -> torch.Tensor:
    """``scores`` ``(T, E)`` with every expert outside each token's ``max_nodes`` best nodes set to
    ``-inf``, so a top-k over the result picks only from those nodes (ties: the lower node first)."""
    check_node_limit(scores.shape[1], k, n_nodes, max_nodes)
    per_node = max(1, k // max_nodes)
    ranked = node_scores(scores, n_nodes, per_node)  # (T, N)
    chosen = torch.sort(ranked, dim=-1, descending=True, stable=True).indices[:, :max_nodes]  # (T, M)
    allowed = torch.zeros_like(ranked, dtype=torch.bool).scatter_(1, chosen, True)  # (T, N)
    allowed = allowed.repeat_interleave(scores.shape[1] // n_nodes, dim=1)  # (T, E)
    return scores.masked_fill(~allowed, float("-inf"))


def cross_node_rows(experts: torch.Tensor, home_node: torch.Tensor, n_experts: int, n_nodes: int,
                    dedup: bool = False) -> int:
    """Rows a dispatch sends off each token's ``home_node`` ``(T,)`` for ``experts`` ``(T, k)``: one per
    token-slot on another node, or with ``dedup`` one per distinct other node (DeepSeek-V3's dispatch).
    The combine sends as many back."""
    nodes = node_of_expert(n_experts, n_nodes)[experts]  # (T, k)
    away = nodes != home_node[:, None]  # (T, k)
    if not dedup:
        return int(away.sum())
    reached = torch.zeros(experts.shape[0], n_nodes, dtype=torch.bool).scatter_(1, nodes, True)  # (T, N)
    reached[torch.arange(experts.shape[0]), home_node] = False
    return int(reached.sum())


def nodes_per_token(experts: torch.Tensor, n_experts: int, n_nodes: int) -> torch.Tensor:
    """``(T,)`` how many distinct nodes each token's experts sit on."""
    nodes = node_of_expert(n_experts, n_nodes)[experts]  # (T, k)
    return torch.zeros(experts.shape[0], n_nodes, dtype=torch.bool).scatter_(1, nodes, True).sum(dim=1)


def tokens_changed(experts: torch.Tensor, unlimited: torch.Tensor) -> int:
    """Tokens whose set of chosen experts differs between two routings ``(T, k)``: the quality cost."""
    return int((experts.sort(dim=1).values != unlimited.sort(dim=1).values).any(dim=1).sum())
