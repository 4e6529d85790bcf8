"""Where each mesh axis talks, and what one forward pass sends along it.

* **Placement**: a tensor-parallel group, an expert group or a stage boundary runs over the cluster's
  link inside a node, or over the link between nodes as soon as any of its ranks sit on different nodes
  (``axis_link``, ``hop_links``). A collective whose group crosses nodes is priced as one ring at the
  network's rate: the plain model. NCCL's hierarchical and multi-NIC algorithms do better for large
  messages on nodes with one network port per GPU; on nodes that share fewer ports they do worse.
  ``kind`` names how a layout sits on the nodes; ``counterpart`` is the same GPUs per copy cut the
  other way across them.
* **Traffic**: ``forward_traffic`` is the collectives one forward pass issues per mesh axis: the
  prediction that the combined run on ranks (``drivers.run_combined``) must match call for call and
  byte for byte.

Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import Cluster, Link


# -- placement: which link each axis uses ---------------------------------------------------------------
def crosses_nodes(cluster: Cluster, ranks) -> bool:
    return len({cluster.node_of(r) for r in ranks}) > 1


def _boundary_crosses(layout: Layout, cluster: Cluster, stage: int) -> bool:
    """Whether any rank's hop from ``stage`` to the next leaves its node."""
    return any(crosses_nodes(cluster, (layout.rank(stage, d, t), layout.rank(stage + 1, d, t)))
               for d in range(layout.dp) for t in range(layout.tp))


def hop_links(layout: Layout, cluster: Cluster) -> list[Link]:
    """The link of each stage boundary: the slower one if any rank's hop across it leaves its node."""
    return [cluster.inter_link if _boundary_crosses(layout, cluster, s) else cluster.intra_link
            for s in range(layout.pp - 1)]


def return_link(layout: Layout, cluster: Cluster) -> Link:
    """The link a sampled token takes from the last stage back to the first, to start its next step."""
    return axis_link(cluster, [(layout.rank(0, d, 0), layout.rank(layout.pp - 1, d, 0)) for d in range(layout.dp)])


def axis_link(cluster: Cluster, groups) -> Link:
    return cluster.inter_link if any(crosses_nodes(cluster, g) for g in groups) else cluster.intra_link


def pipeline_crosses_nodes(layout: Layout, cluster: Cluster) -> bool:
    return any(_boundary_crosses(layout, cluster, s) for s in range(layout.pp - 1))


def tp_crosses_nodes(layout: Layout, cluster: Cluster) -> bool:
    return any(crosses_nodes(cluster, g) for g in layout.tp_groups())


TP_ACROSS = "TP across nodes"
PP_ACROSS = "TP inside node + PP across nodes"


def kind(layout: Layout, cluster: Cluster) -> str:
    """How ``layout`` sits on ``cluster``'s nodes, in words."""
    if tp_crosses_nodes(layout, cluster):
        return TP_ACROSS
    if pipeline_crosses_nodes(layout, cluster):
        return PP_ACROSS if layout.tp > 1 else "PP across nodes"
    if layout.pp > 1:
        return "TP and PP inside a node" if layout.tp > 1 else "PP inside a node"
    return "TP inside a node" if layout.tp > 1 else "a whole copy per GPU"


def counterpart(layout: Layout, cluster: Cluster) -> Layout | None:
    """The same GPUs per copy cut the other way across nodes. For a pipeline that crosses nodes: the
    fewest of its stages merged into a tensor-parallel group that crosses them (tp = 8, pp = 4 on 8-GPU
    nodes: tp = 16, pp = 2). For a tp that crosses nodes: a node-wide tp, the rest as stages."""
    g = cluster.gpus_per_node
    if tp_crosses_nodes(layout, cluster):
        return Layout(g, layout.pp * layout.tp // g, layout.dp, layout.ep) if layout.tp % g == 0 else None
    if pipeline_crosses_nodes(layout, cluster):
        for k in range(2, layout.pp + 1):
            other = Layout(layout.tp * k, layout.pp // k, layout.dp, layout.ep)
            if layout.pp % k == 0 and tp_crosses_nodes(other, cluster):
                return other
    return None


# -- traffic: what one forward pass sends, per mesh axis (the combined run on ranks checks this) --------
@dataclass(frozen=True)
class AxisTraffic:
    """Summed over every rank: ``count`` calls of ``op`` on mesh axis ``axis``, ``size_bytes`` in all
    (``comm.py``'s counting: the buffer each rank works on)."""

    axis: str
    op: str
    count: int
    size_bytes: int


COUNT_BYTES = 8  # the dispatch's counts: one int64 per expert


def forward_traffic(model: ModelConfig, layout: Layout, batch: int, seq_tokens: int,
                    n_microbatches: int) -> list[AxisTraffic]:
    """The collectives of one forward pass of ``batch`` sequences of ``seq_tokens`` per replica, cut
    into ``n_microbatches`` equal microbatches, summed over every rank. A dense block: 2 all-reduces per
    layer of its stage per microbatch on the tp axis. An MoE block (``layouts.moe_mlp``): 1 all-reduce
    (the attention's) and 1 all-gather of the MoE's output rows on the tp axis, and on the ep axis (ep > 1)
    3 all-to-alls per rank: the counts (one int64 per expert), the dispatch (the rank's ``1/tp`` of the
    tokens, ``k`` rows each) and the combine (the rows its experts served). Dropless: every token-slot is
    sent and served, so summed over a stage the combine's rows equal the dispatch's, whatever the router
    chose. Each tp rank of a stage sends its copy of the microbatch's activations to its counterpart in
    the next stage. Stages may be uneven: summed over the ranks, every layer is counted once per tp x dp
    rank."""
    whole_number(batch, "batch")
    whole_number(seq_tokens, "seq_tokens")
    m = whole_number(n_microbatches, "n_microbatches")
    if batch % m:
        raise ValueError(f"forward_traffic needs equal microbatches: batch {batch} into {m} microbatches "
                         f"({batch} % {m} = {batch % m})")
    mb_bytes = int(batch // m * seq_tokens * model.d_model * model.bytes_per_param)
    ranks_per_stage = layout.tp * layout.dp
    out = []
    if layout.tp > 1:
        calls = ranks_per_stage * (1 if model.is_moe else 2) * model.n_layers * m
        out.append(AxisTraffic("tp", "all_reduce", calls, calls * mb_bytes))
        if model.is_moe:  # the MoE output rows, gathered whole on every tp rank
            calls = ranks_per_stage * model.n_layers * m
            out.append(AxisTraffic("tp", "all_gather", calls, calls * mb_bytes))
    if model.is_moe and layout.ep > 1:
        calls = 3 * ranks_per_stage * model.n_layers * m
        counts = ranks_per_stage * model.n_experts * COUNT_BYTES
        rows = 2 * layout.dp * mb_bytes * model.experts_per_token  # dispatch and combine, the stage's tokens x k
        out.append(AxisTraffic("ep", "all_to_all_single", calls, (counts + rows) * model.n_layers * m))
    if layout.pp > 1:
        n = (layout.pp - 1) * layout.tp * layout.dp * m
        out += [AxisTraffic("pp", "send", n, n * mb_bytes), AxisTraffic("pp", "recv", n, n * mb_bytes)]
    return out
