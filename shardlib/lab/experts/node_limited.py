"""Node-limited routing measured (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2): the rows a dispatch sends
off each token's home node, counted from the one-process routing and measured from the ranks' comm logs.

The experts sit on ``n_nodes`` nodes in contiguous blocks (expert ``e`` on node ``e // (E / N)``), here one
rank each. ``cross_node_rows`` counts one row per token-slot on another node, or with DeepSeek-V3's dedup
one per distinct remote node (NVLink forwarding the copies inside the node). ``tokens_changed`` is the
quality cost: tokens whose chosen experts differ from unlimited routing. ``run_node_limited`` sets both
policies' counts beside the all-to-alls the ranks really sent.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.experts.routing import MoEConfig, route
from shardlib.lab.experts.drivers import token_groups
from shardlib.lab.experts.training import MoETrainWeights, make_moe_problem, project
from shardlib.lab.harness import Measured, on_ranks


# -- counting ------------------------------------------------------------------------------------------------
def nodes_reached(experts: torch.Tensor, n_experts: int, n_nodes: int) -> torch.Tensor:
    """``(T, n_nodes)`` bool: the nodes each token's ``experts`` ``(T, k)`` sit on, expert ``e`` on node
    ``e // (n_experts / n_nodes)``."""
    nodes = experts // (n_experts // n_nodes)  # (T, k)
    return torch.zeros(experts.shape[0], n_nodes, dtype=torch.bool).scatter_(1, nodes, True)


def cross_node_rows(experts: torch.Tensor, home_node: torch.Tensor, n_experts: int, n_nodes: int,
                    dedup: bool = False) -> int:
    """Rows a dispatch sends off each token's ``home_node`` ``(T,)`` for ``experts`` ``(T, k)``: one per
    token-slot on another node, or with ``dedup`` one per distinct other node. The combine sends as many back."""
    if not dedup:
        return int((experts // (n_experts // n_nodes) != home_node[:, None]).sum())
    reached = nodes_reached(experts, n_experts, n_nodes)  # (T, N)
    reached[torch.arange(experts.shape[0]), home_node] = False
    return int(reached.sum())


def tokens_changed(experts: torch.Tensor, unlimited: torch.Tensor) -> int:
    """Tokens whose set of chosen experts differs between two routings ``(T, k)``: the quality cost."""
    return int((experts.sort(dim=1).values != unlimited.sort(dim=1).values).any(dim=1).sum())


# -- on ranks ------------------------------------------------------------------------------------------------
def node_dispatch_on_rank(ctx, x: torch.Tensor, weights: MoETrainWeights, cfg: MoEConfig) -> torch.Tensor:
    """Route this rank's share of ``x`` with ``cfg`` (node-limited when ``cfg.max_nodes`` is set), then send
    its rows to the ranks holding their experts twice, each an all-to-all after its counts: once per
    token-slot, once per distinct rank (DeepSeek-V3's dispatch sends a token to a node once). Each rank is
    a node (``cfg.n_nodes`` must be the world size). Returns the chosen experts ``(T_r, k)``."""
    if cfg.n_nodes != ctx.world_size:
        raise ValueError(f"this measurement makes each rank a node: n_nodes must be the world size "
                         f"{ctx.world_size}, got {cfg.n_nodes}")
    n_local = cfg.n_experts // ctx.world_size  # MoEConfig checked that the nodes divide the experts
    with torch.no_grad():
        h = project(token_groups(x, ctx.world_size)[ctx.rank], weights.w_in)  # (T_r, d_model)
        experts = route(h, weights.router, cfg).experts  # (T_r, k)
    dest = experts // n_local  # (T_r, k) the rank holding each slot's expert
    reached = nodes_reached(experts, cfg.n_experts, ctx.world_size)  # (T_r, ep): each rank a node
    dedup_token, dedup_rank = torch.nonzero(reached, as_tuple=True)  # one row per (token, destination rank)
    for token, rank in ((torch.arange(dest.shape[0]).repeat_interleave(cfg.k), dest.flatten()),
                        (dedup_token, dedup_rank)):
        to_rank = torch.bincount(rank, minlength=ctx.world_size).tolist()
        order = torch.sort(rank, stable=True).indices
        ctx.comm.all_to_all_single(h[token[order]], to_rank, ctx.comm.exchange_counts(to_rank))
    return experts


@dataclass(frozen=True)
class NodeLimitedRun:
    """Unlimited against node-limited routing of the same tokens, each rank an emulated node. Per policy,
    the rows sent off their home node, one per token-slot (``"slots"``) and one per distinct remote node
    (``"dedup"``, DeepSeek-V3's dispatch): ``predicted`` from the one-process routing
    (``cross_node_rows``), ``measured`` from the comm logs (wire bytes over the row's bytes).
    ``bound_rows`` is DeepSeek-V3's bound on the dedup rows, ``max_nodes`` per token."""

    max_nodes: int
    n_tokens: int
    row_bytes: int  # one token row, d_model values
    predicted: dict  # policy -> {"slots": rows, "dedup": rows}
    measured: dict
    most_nodes_per_token: dict  # policy -> the most nodes any token reached
    tokens_changed: int  # tokens whose top-k differs from unlimited routing: the quality cost

    bound_rows = property(lambda self: self.n_tokens * self.max_nodes)

    @property
    def exact(self) -> bool:
        return self.predicted == self.measured

def _rows_sent(got: Measured, which: int, row_bytes: int) -> int:
    """Rows every rank sent to other ranks in its ``which``-th dispatch (0 per slot, 1 deduplicated)."""
    return sum(got.records("all_to_all_single", rank)[2 * which + 1].wire_bytes for rank in got.ranks) // row_bytes


def run_node_limited(ranks, config: MoEConfig, max_nodes: int = 1, n_tokens: int = 256) -> NodeLimitedRun:
    """Route ``n_tokens`` tokens with ``config`` unlimited and limited to ``max_nodes`` of ``world_size``
    emulated nodes (one per rank); send each policy's rows through real all-to-alls; set the cross-node
    rows measured from the comm logs beside the counts from the one-process routing."""
    n_nodes = ranks.world_size
    limited = config.but(n_nodes=n_nodes, max_nodes=max_nodes)
    cfgs = {"unlimited": config.but(n_nodes=n_nodes, max_nodes=None), "limited": limited}
    problem = make_moe_problem(limited, n_tokens)
    home = torch.cat([torch.full((len(g),), r) for r, g in enumerate(token_groups(problem.x, n_nodes))])  # (T,)
    row_bytes = limited.d_model * problem.x.element_size()
    predicted, measured, most, chosen = {}, {}, {}, {}
    for policy, cfg in cfgs.items():
        with ranks.same_threads():
            chosen[policy] = experts = route(project(problem.x, problem.weights.w_in), problem.weights.router,
                                             cfg).experts  # (T, k)
        predicted[policy] = {kind: cross_node_rows(experts, home, cfg.n_experts, n_nodes, dedup=kind == "dedup")
                             for kind in ("slots", "dedup")}
        got = on_ranks(ranks, node_dispatch_on_rank, problem.x, problem.weights, cfg)
        measured[policy] = {"slots": _rows_sent(got, 0, row_bytes), "dedup": _rows_sent(got, 1, row_bytes)}
        most[policy] = int(nodes_reached(experts, cfg.n_experts, n_nodes).sum(dim=1).max())
    return NodeLimitedRun(max_nodes, n_tokens, row_bytes, predicted, measured, most,
                          tokens_changed(chosen["limited"], chosen["unlimited"]))
