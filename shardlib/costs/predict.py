"""The communication of whole forward passes, priced with the alpha-beta formulas of ``alpha_beta``.

* Tensor parallelism, decode against prefill (the chapter's table): ``2 x n_layers`` all-reduces per
  forward pass (Megatron-LM, Shoeybi et al. 2019), each of ``tokens x d_model`` activations. Decode
  moves one token per sequence: latency-bound for a lone sequence, bandwidth-bound past
  ``decode_crossover_batch`` sequences; prefill moves the whole prompt, bandwidth-bound.
* Pipeline against tensor: the same forward pass split by layers (one point-to-point send per stage
  boundary, GPipe, Huang et al. 2019) or within layers.
* Replicas against tensor parallelism: the throughput of ``world_size`` independent copies against one
  tensor-parallel copy.

Pure: numbers in, numbers out.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..checks import number_at_least, positive_number, whole_number
from ..models import ModelConfig, check_tensor_parallel
from .alpha_beta import collective_terms_s, cost_terms, point_to_point_s


# -- tensor parallelism: decode vs prefill ---------------------------------------------------------------
@dataclass(frozen=True)
class PhaseCost:
    """The tensor-parallel communication of one forward pass of ``tokens`` tokens: ``collectives``
    all-reduces of ``size_bytes`` each, split into the latency and the bandwidth part."""

    phase: str
    model: str
    link: str
    tp: int
    tokens: int
    collectives: int
    size_bytes: int
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


def tp_forward_cost(model: ModelConfig, tp: int, link, tokens: int, phase: str = "forward",
                    latency_charge: str = "per_call") -> PhaseCost:
    """Megatron-LM tensor parallelism (Shoeybi et al. 2019): two all-reduces per layer in the forward pass
    (after attention and after the MLP), each of ``tokens x d_model`` activations in the model's dtype."""
    whole_number(tp, "tp")
    check_tensor_parallel(model, tp, copy_kv_heads=True)  # a formula: KV heads copied past the wall are allowed
    tokens = whole_number(tokens, "tokens")
    size_bytes = int(tokens * model.d_model * model.bytes_per_param)
    collectives = 0 if tp == 1 else 2 * model.n_layers
    latency, bandwidth = (collective_terms_s("all_reduce", size_bytes, tp, link, latency_charge)
                          if collectives else (0.0, 0.0))
    return PhaseCost(phase, model.name, link.name, tp, tokens, collectives, size_bytes,
                     collectives * latency, collectives * bandwidth)


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


def format_tp_cost_table(model: ModelConfig, links, tp_degrees=(2, 4, 8), prompt_tokens: int = 2048,
                         latency_charge: str = "per_call") -> str:
    """The table as plain text: decode in microseconds per token, prefill in milliseconds per prompt."""
    rows = tp_cost_table(model, links, tp_degrees, prompt_tokens, latency_charge)
    decode0, prefill0 = rows[0]["decode"][tp_degrees[0]], rows[0]["prefill"][tp_degrees[0]]
    name_w = max(26, max(len(row["link"]) for row in rows) + 2)
    heads = "".join(f"{'tp=' + str(n):>9}" for n in tp_degrees)
    lines = [f"{model.name}: {model.n_layers} layers, d_model {model.d_model}, {model.bytes_per_param:g} bytes per "
             f"value; {decode0.collectives} all-reduces per forward pass ({latency_charge} latency; "
             f"alpha-beta model, not a measurement)",
             f"decode: 1 token, {decode0.size_bytes:,} bytes per all-reduce;  prefill: {prompt_tokens:,}-token "
             f"prompt, {prefill0.size_bytes:,} bytes per all-reduce",
             f"{'':<{name_w}}{'decode, us per token':>{9 * len(tp_degrees)}}   "
             f"{'prefill, ms per prompt':>{9 * len(tp_degrees)}}",
             f"{'link':<{name_w}}{heads}   {heads}"]
    for row in rows:
        decode = "".join(f"{row['decode'][n].total_s * 1e6:>9.0f}" for n in tp_degrees)
        prefill = "".join(f"{row['prefill'][n].total_s * 1e3:>9.1f}" for n in tp_degrees)
        lines.append(f"{row['link']:<{name_w}}{decode}   {prefill}")
    return "\n".join(lines)


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


# -- replicas vs tensor parallelism --------------------------------------------------------------------


def decode_step_compute_s(model: ModelConfig, memory_bytes_per_s: float, tp: int = 1) -> float:
    """The memory-bound floor of one decode step: every weight is read once, ``weight_bytes / tp`` per
    device, at the memory's bandwidth. (Real steps also read the KV cache and are slower.)"""
    return model.weight_bytes / whole_number(tp, "tp") / positive_number(memory_bytes_per_s, "memory_bytes_per_s")


def fits_on_device(model: ModelConfig, memory_bytes: float, tp: int = 1) -> bool:
    """Whether the weights alone, split ``tp`` ways, fit in one device's memory."""
    return model.weight_bytes / whole_number(tp, "tp") <= positive_number(memory_bytes, "memory_bytes")


@dataclass(frozen=True)
class ReplicasVsTensorParallel:
    """``world_size`` devices as independent replicas, or as one tensor-parallel copy, serving decode steps
    of ``tokens_per_step`` tokens (one per sequence). A replica's step is the whole compute; the
    tensor-parallel step is ``compute / n`` plus its communication, and serves one batch for all ``n``
    devices. A step makes one token of every sequence, so the step *is* the latency per token."""

    world_size: int
    tokens_per_step: int
    replica_step_s: float
    tp_step_s: float

    @property
    def replicas_tokens_per_s(self) -> float:
        return self.world_size * self.tokens_per_step / self.replica_step_s

    @property
    def tp_tokens_per_s(self) -> float:
        return self.tokens_per_step / self.tp_step_s

    @property
    def replicas_tokens_per_s_per_device(self) -> float:
        return self.replicas_tokens_per_s / self.world_size

    @property
    def tp_tokens_per_s_per_device(self) -> float:
        return self.tp_tokens_per_s / self.world_size

    @property
    def throughput_ratio(self) -> float:
        """Replicas' tokens/s over tensor parallelism's: ``1 + n * comm / compute``, never below 1."""
        return self.replicas_tokens_per_s / self.tp_tokens_per_s

    @property
    def latency_ratio(self) -> float:
        """Tensor parallelism's latency per token over a replica's: ``1/n + comm / compute``, below 1
        while the communication costs less than the ``1 - 1/n`` of the compute it saves."""
        return self.tp_step_s / self.replica_step_s


def replicas_vs_tensor_parallel(step_compute_s: float, comm_s_per_step: float, world_size: int,
                                tokens_per_step: int) -> ReplicasVsTensorParallel:
    """Throughput of ``world_size`` devices as replicas against one tensor-parallel copy (see the dataclass)."""
    compute = positive_number(step_compute_s, "step_compute_s")
    number_at_least(comm_s_per_step, "comm_s_per_step (seconds)")
    n = whole_number(world_size, "world_size")
    return ReplicasVsTensorParallel(n, whole_number(tokens_per_step, "tokens_per_step"), compute,
                                    compute / n + (comm_s_per_step if n > 1 else 0.0))
