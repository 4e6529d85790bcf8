"""One forward pass under tensor parallelism: the TP all-reduces, weights read, FLOPs.

One set of functions, priced with ``predict.alpha_beta``, for the communication-costs chapter's table and
explorer and for the serving planner's stages (``decode``):

* ``tp_all_reduces``: Megatron-LM (Shoeybi et al. 2019) makes two all-reduces per layer in the forward pass
  (after attention, after the MLP; one where experts take the MLP's place), each of ``tokens x d_model``
  activations. Every TP all-reduce of a serving cost goes through it.
* decode against prefill, ``decode_crossover_batch`` (where decode turns bandwidth-bound), the table;
  pipeline against tensor traffic (one send per stage boundary, GPipe, Huang et al. 2019);
* ``layer_read_bytes``, ``forward_flops`` (``2 x params x tokens``).

Replicas against tp: ``replicas``. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.mesh import Layout
from shardlib.facts.hardware import Link
from shardlib.predict.alpha_beta import collective_terms_s, cost_terms, point_to_point_s
from shardlib.predict.shapes import check_tensor_parallel, layer_params_per_device

ALL_REDUCES_PER_LAYER = 2  # Megatron-LM: after attention and after the MLP


# -- the TP all-reduces of a forward pass -----------------------------------------------------------------
@dataclass(frozen=True)
class PhaseCost:
    """The tensor-parallel communication of a forward pass of ``tokens`` tokens: ``collectives``
    all-reduces of ``size_bytes`` each over ``tp`` devices, split into the latency and the bandwidth part
    (seconds, every call one after another)."""

    phase: str
    link: str
    tp: int
    tokens: float
    collectives: int
    size_bytes: float
    latency_s: float
    bandwidth_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    @property
    def bound(self) -> str:
        """Which part dominates: ``"latency"`` or ``"bandwidth"`` (``"none"`` when nothing moves)."""
        if self.collectives == 0:
            return "none"
        return "latency" if self.latency_s >= self.bandwidth_s else "bandwidth"


def tp_all_reduces(d_model: int, bytes_per_value: float, layers: int, tp: int, link: Link, tokens: float,
                   latency_charge: str = "per_call", per_layer: int = ALL_REDUCES_PER_LAYER,
                   phase: str = "forward") -> PhaseCost:
    """The TP all-reduces of ``layers`` layers in a forward pass of ``tokens`` tokens: ``per_layer`` per
    layer, each of ``tokens x d_model`` values of ``bytes_per_value`` bytes (``tokens`` may be a fraction:
    a microbatch's share of a batch)."""
    size_bytes = tokens * d_model * bytes_per_value  # (tokens, d_model) activations
    count = 0 if tp == 1 else per_layer * layers
    latency, bandwidth = collective_terms_s("all_reduce", size_bytes, tp, link, latency_charge) if count else (0.0, 0.0)
    return PhaseCost(phase, link.name, tp, tokens, count, size_bytes, count * latency, count * bandwidth)


# -- tensor parallelism: decode vs prefill ---------------------------------------------------------------
def tp_forward_cost(model: ModelConfig, tp: int, link, tokens: int, phase: str = "forward",
                    latency_charge: str = "per_call") -> PhaseCost:
    """A whole forward pass of ``tokens`` tokens: ``tp_all_reduces`` over every layer."""
    whole_number(tp, "tp")
    check_tensor_parallel(model, tp, copy_kv_heads=True)  # a formula: KV heads copied past the wall are allowed
    reduces = tp_all_reduces(model.d_model, model.bytes_per_param, model.n_layers, tp, link,
                             whole_number(tokens, "tokens"), latency_charge, phase=phase)
    return replace(reduces, size_bytes=int(reduces.size_bytes))


def tp_decode_cost(model: ModelConfig, tp: int, link, batch: int = 1,
                   latency_charge: str = "per_call") -> PhaseCost:
    """One decode step: one new token for each of ``batch`` sequences, so each all-reduce carries one
    ``d_model`` vector per sequence (8 KiB for Llama-3-8B in bf16). With ``batch = 1`` it is the cost
    per generated token; past ``decode_crossover_batch`` sequences it is bandwidth-bound."""
    return tp_forward_cost(model, tp, link, whole_number(batch, "batch"), "decode", latency_charge)


def decode_crossover_batch(model: ModelConfig, tp: int, link, latency_charge: str = "per_call") -> float:
    """The batch (sequences per decode step) at which a decode all-reduce's bytes cost as much as its
    latency: below it the step is latency-bound, above it bandwidth-bound. Infinite at ``tp = 1``."""
    whole_number(tp, "tp")
    check_tensor_parallel(model, tp, copy_kv_heads=True)  # a formula: KV heads copied past the wall are allowed
    if tp == 1:
        return float("inf")
    latency, per_byte = collective_terms_s("all_reduce", 1, tp, link, latency_charge)
    return latency / (per_byte * model.d_model * model.bytes_per_param)


def tp_prefill_cost(model: ModelConfig, tp: int, link, prompt_tokens: int, batch: int = 1,
                    latency_charge: str = "per_call") -> PhaseCost:
    """Prefill of ``batch`` prompts of ``prompt_tokens`` each: the same number of all-reduces as a decode
    step, but each carries every prompt token's activations."""
    tokens = whole_number(prompt_tokens, "prompt_tokens") * whole_number(batch, "batch")
    return tp_forward_cost(model, tp, link, tokens, "prefill", latency_charge)


def tp_cost_table(model: ModelConfig, links, tp_degrees=(2, 4, 8), prompt_tokens: int = 2048,
                  latency_charge: str = "per_call") -> list[dict]:
    """One row per link: decode (per token) and prefill (per ``prompt_tokens`` prompt) at each tp degree."""
    return [{"link": link.name,
             "decode": {n: tp_decode_cost(model, n, link, 1, latency_charge) for n in tp_degrees},
             "prefill": {n: tp_prefill_cost(model, n, link, prompt_tokens, 1, latency_charge) for n in tp_degrees}}
            for link in links]


# -- pipeline vs tensor -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PipelineVsTensor:
    """One forward pass of ``tokens`` tokens over ``world_size`` devices, split by layers or within layers.

    Tensor: ``2 x n_layers`` all-reduces, every device sending ``2(n-1)/n`` of each. Pipeline (GPipe,
    Huang et al. 2019): ``world_size - 1`` point-to-point sends of the activations, one per stage boundary, one
    after another on the critical path.
    """

    world_size: int
    size_bytes: int  # one activation tensor: tokens x d_model x bytes per value
    tensor_transfers: int
    tensor_bytes: float  # summed over every device
    tensor_s: float
    pipeline_transfers: int
    pipeline_bytes: float
    pipeline_s: float


def pipeline_vs_tensor(model: ModelConfig, world_size: int, link, tokens: int,
                       latency_charge: str = "per_call") -> PipelineVsTensor:
    """Bytes and time of the communication of one forward pass, tensor-parallel against pipelined."""
    cost = tp_forward_cost(model, world_size, link, tokens, latency_charge=latency_charge)
    _, factor = cost_terms("all_reduce", world_size)
    boundaries = world_size - 1
    if boundaries > model.n_layers - 1:
        raise ValueError(f"{model.name} has {model.n_layers} layers: it cannot be cut into {world_size} stages")
    return PipelineVsTensor(world_size, cost.size_bytes, cost.collectives,
                            world_size * cost.collectives * factor * cost.size_bytes, cost.total_s, boundaries,
                            boundaries * cost.size_bytes, boundaries * point_to_point_s(cost.size_bytes, link))


# -- weights read and FLOPs ------------------------------------------------------------------------------
def forward_flops(params: float, tokens: float) -> float:
    """A forward pass's arithmetic: a multiply and an add per weight per token, ``2 x params x tokens``."""
    return 2 * params * tokens


def layer_read_bytes(model: ModelConfig, layout: Layout, tokens: float, layers: int) -> float:
    """Weight bytes of ``layers`` layers one GPU of ``layout`` reads for ``tokens`` tokens: its ``1/tp``
    of the attention's q and o, its KV heads' k and v, its share of the experts (of an MoE layer only the
    experts the tokens reach), and the replicated norms and router."""
    attention, experts, replicated = layer_params_per_device(model, layout.tp, layout.ep)
    reached = 1.0
    if model.is_moe:  # tokens of every replica in the ep group reach its experts
        routed = tokens * max(1, layout.ep // layout.tp)
        reached = 1 - (1 - model.experts_per_token / model.n_experts) ** routed
    return layers * ((attention + experts * reached) * model.matrix_bytes_per_param
                     + replicated * model.bytes_per_param)

