"""The planner's cost model: steady-state pipelined decode, and a prefill, for one layout.

A replica's batch is cut into ``m`` microbatches that chase each other round the stages (pipelined
serving, as in Megatron-LM and vLLM), so nothing fills or drains between steps::

    trip  = stage_1 + ... + stage_pp + hops        cycle = max(trip, m x slowest stage)
    latency per token = cycle;   tokens/s = dp x batch / cycle;   m from pp up to 2 pp

One stage on one microbatch is a roofline (Williams et al. 2009), ``max(bytes read / memory bandwidth,
FLOPs / peak)`` at ``Workload.kernel_efficiency`` of both peaks, plus its collectives: 2 tp all-reduces a
layer (Megatron-LM), the ep all-to-alls (``ep_all_to_all``), one hop per stage boundary.
Bytes read: the GPU's weights (of an MoE layer only the experts reached), the head on the last stage, the
KV cache. Prefill fills and drains (GPipe): ``(m + pp - 1)`` slowest-stage times plus the hops. Nothing
overlaps communication with compute. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.core.pipeline.stages import stage_layer_counts
from shardlib.facts.hardware import Cluster, Link
from shardlib.predict.alpha_beta import point_to_point_s
from shardlib.predict.experts import ExpertAllToAll, expert_all_to_all
from shardlib.predict.serving.cost import ALL_REDUCES_PER_LAYER, forward_flops, layer_read_bytes, tp_all_reduces
from shardlib.predict.serving.memory import (
    Workload,
    active_params_per_gpu,
    affordable_batch,
    check_layout,
    kv_bytes_per_sequence,
    memory_per_gpu,
)
from shardlib.predict.serving.traffic import axis_link, hop_links, return_link
from shardlib.predict.shapes import Memory, padded_vocab_size, stage_layers

TOKEN_ID_BYTES = 4  # a sampled token id (int32) on its way back to the first stage


@dataclass(frozen=True)
class StageCost:
    """One microbatch through one stage, on one GPU of it."""

    read_s: float  # weights, head and KV cache read from memory
    compute_s: float  # the arithmetic at peak
    comm_s: float  # its collectives, one after another
    collectives: int

    @property
    def total_s(self) -> float:
        return max(self.read_s, self.compute_s) + self.comm_s


def _comm(model: ModelConfig, cluster: Cluster, layout: Layout, tokens: float, tp_link: Link,
          ep_link: Link, layers: int) -> tuple[float, int]:
    """Seconds and count of the collectives of a stage of ``layers`` layers for ``tokens`` tokens: the TP
    all-reduces (``cost.tp_all_reduces``; one per layer where experts replace the MLP) and the EP
    all-to-alls (dispatch and combine per layer)."""
    reduces = tp_all_reduces(model.d_model, model.bytes_per_param, layers, layout.tp, tp_link, tokens,
                             cluster.latency_charge, per_layer=1 if layout.ep > 1 else ALL_REDUCES_PER_LAYER)
    seconds, count = reduces.total_s, reduces.collectives
    if layout.ep > 1:
        n = 2 * layers
        seconds += n * ep_all_to_all(model, cluster, layout, tokens).seconds
        count += n
    return seconds, count


def ep_all_to_all(model: ModelConfig, cluster: Cluster, layout: Layout, tokens: float) -> ExpertAllToAll:
    """One dispatch (or combine) of a replica's microbatch of ``tokens`` over ``layout``'s expert groups on
    ``cluster``, per rank: each of the replica's ``tp`` ranks routes its ``1/tp`` of the tokens (as
    ``traffic.forward_traffic`` counts it; DeepSeek-V3's attention TP with sequence parallelism). Each leg on
    its own link, node-limited where the model's router is (``predict.experts``; DeepSeek-V3: each token on
    at most 4 nodes, one network copy per node)."""
    nodes = max(len({cluster.node_of(r) for r in g}) for g in layout.ep_groups())
    return expert_all_to_all(tokens / layout.tp, model.d_model, model.experts_per_token, layout.ep, nodes,
                             cluster.intra_link, cluster.inter_link, model.bytes_per_param, model.node_limit,
                             cluster.latency_charge)


def stage_costs(model: ModelConfig, cluster: Cluster, layout: Layout, sequences: float, tokens_per_sequence: int,
                kv_bytes_per_gpu: float, efficiency: float = 1.0) -> list[StageCost]:
    """Each stage's cost for one microbatch of ``sequences`` x ``tokens_per_sequence`` tokens, the heaviest
    stage reading ``kv_bytes_per_gpu`` of KV cache (the others in proportion to their layers); the last
    stage also runs the output head (one token per sequence). Peaks times ``efficiency``."""
    tokens = sequences * tokens_per_sequence
    tp_link = axis_link(cluster, layout.tp_groups())
    ep_link = axis_link(cluster, layout.ep_groups())
    head_params = padded_vocab_size(model, layout.tp) * model.d_model / layout.tp
    heaviest = stage_layers(model, layout.pp)
    bandwidth, peak = cluster.memory_bytes_per_s * efficiency, cluster.peak_flops_per_s * efficiency
    out = []
    for stage, layers in enumerate(stage_layer_counts(model.n_layers, layout.pp)):
        last = stage == layout.pp - 1
        comm_s, count = _comm(model, cluster, layout, tokens, tp_link, ep_link, layers)
        read = (layer_read_bytes(model, layout, tokens, layers) + kv_bytes_per_gpu * layers / heaviest
                + (head_params * model.bytes_per_param if last else 0.0))
        flops = (forward_flops(active_params_per_gpu(model, layout) * layers / heaviest, tokens)
                 + (forward_flops(head_params, sequences) if last else 0.0))
        out.append(StageCost(read / bandwidth, flops / peak, comm_s, count))
    return out


def hops_s(model: ModelConfig, cluster: Cluster, layout: Layout, tokens: float, sequences: float) -> float:
    """A microbatch's activations across every stage boundary, and its sampled tokens back to the first."""
    if layout.pp == 1:
        return 0.0
    forward = sum(point_to_point_s(tokens * model.d_model * model.bytes_per_param, link)
                  for link in hop_links(layout, cluster))
    return forward + point_to_point_s(sequences * TOKEN_ID_BYTES, return_link(layout, cluster))


@dataclass(frozen=True)
class Score:
    """A layout's steady-state decode and its prefill, per the module docstring."""

    layout: Layout
    memory: Memory  # per GPU of the heaviest stage, at ``batch``
    batch: int  # sequences in flight per replica
    batch_set_by: str  # "free memory", "max_batch" or "the workload"
    n_microbatches: int
    stages: tuple[StageCost, ...]  # one microbatch through each stage
    hops_s: float  # one microbatch's hops, and its tokens back to the first stage
    decode_step_s: float  # the cycle: time between two tokens of a sequence = decode latency per token
    tokens_per_s: float  # decode, whole cluster
    prefill_s: float  # the batch's prompts, one forward pass in m microbatches
    first_token_s: float  # one prompt alone through the layout
    tp_link: str

    @property
    def trip_s(self) -> float:
        """One token's trip: every stage one after another, plus the hops."""
        return sum(s.total_s for s in self.stages) + self.hops_s

    @property
    def decode_stage_s(self) -> float:
        """The slowest stage's time for one microbatch."""
        return max(s.total_s for s in self.stages)

    @property
    def comm_s(self) -> float:
        """Collectives on one token's trip, summed over its stages."""
        return sum(s.comm_s for s in self.stages)

    @property
    def idle_fraction(self) -> float:
        """Steady state (no fill and drain): the share of a cycle the slowest stage waits, for hops or for
        want of microbatches."""
        return max(0.0, 1 - self.n_microbatches * self.decode_stage_s / self.decode_step_s)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_s / self.layout.world_size


def _decode(model, cluster, layout, workload, batch, m):
    """``(stages, hops, cycle)`` of steady-state decode with ``batch`` sequences in ``m`` microbatches."""
    per_mb = batch / m
    kv = per_mb * kv_bytes_per_sequence(model, layout, workload.context_tokens)
    stages = stage_costs(model, cluster, layout, per_mb, 1, kv, workload.kernel_efficiency)
    hops = hops_s(model, cluster, layout, per_mb, per_mb)
    trip = sum(s.total_s for s in stages) + hops
    return stages, hops, max(trip, m * max(s.total_s for s in stages))


def _prefill_s(model, cluster, layout, sequences: float, prompt_tokens: int, m: int, efficiency: float) -> float:
    per_mb = sequences / m
    stages = stage_costs(model, cluster, layout, per_mb, prompt_tokens, 0.0, efficiency)
    return (m + layout.pp - 1) * max(s.total_s for s in stages) + hops_s(model, cluster, layout,
                                                                           per_mb * prompt_tokens, per_mb)


def microbatch_choices(layout: Layout, workload: Workload, batch: int) -> list[int]:
    """The ``m`` the planner tries: the workload's, or ``pp`` to ``2 pp`` (at most the batch)."""
    if layout.pp == 1:
        return [1]
    if workload.microbatches:
        return [min(workload.microbatches, batch)]
    return list(range(min(layout.pp, batch), min(2 * layout.pp, batch) + 1))


def score(model: ModelConfig, cluster: Cluster, layout: Layout, workload: Workload = Workload()) -> Score:
    """Steady-state decode and prefill of a layout that passes every rule (ValueError otherwise)."""
    check_layout(model, cluster, layout, workload)
    if workload.batch:
        batch, set_by = workload.batch, "the workload"
    else:
        batch = affordable_batch(model, cluster, layout, workload)
        set_by = "max_batch" if batch == workload.max_batch else "free memory"
    best = None
    for m in microbatch_choices(layout, workload, batch):
        stages, hops, cycle = _decode(model, cluster, layout, workload, batch, m)
        if best is None or cycle < best[3] * (1 - 1e-12):  # the same batch: a shorter cycle is better both ways
            best = (m, stages, hops, cycle)
    m, stages, hops, cycle = best
    tp_link = axis_link(cluster, layout.tp_groups())
    eff = workload.kernel_efficiency
    return Score(layout, memory_per_gpu(model, layout, workload, batch), batch, set_by, m, tuple(stages), hops, cycle,
                 layout.dp * batch / cycle, _prefill_s(model, cluster, layout, batch, workload.prompt_tokens, m, eff),
                 _prefill_s(model, cluster, layout, 1, workload.prompt_tokens, 1, eff), tp_link.name)

