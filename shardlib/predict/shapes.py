"""What a model's shape says per device: which tensor-parallel degrees its heads and widths allow and
what passing a wall costs (KV heads copied, the vocabulary padded), KV heads and KV-cache bytes per device,
a layer's and a stage's parameters per GPU (the memory model both planners share), uneven pipeline stages.
Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlib.core.checks import whole_number
from shardlib.core.config import ModelConfig, head_problems
from shardlib.core.pipeline.stages import stage_layer_counts


def divisors(n: int) -> list[int]:
    """Every whole number that divides ``n``: the degrees a planner tries for ``n`` GPUs."""
    return [d for d in range(1, n + 1) if n % d == 0]


# -- which tensor-parallel degrees a model's shapes allow, and what each costs --------------------------
def tensor_parallel_problems(model: ModelConfig, tp: int, copy_kv_heads: bool = True) -> list[str]:
    """Every reason ``model`` cannot be split ``tp`` ways (empty: it can): whole query heads per device, an
    equal slice of ``d_ff``, and whole KV heads, or past their count each copied on ``tp / n_kv_heads``
    devices (vLLM's way; ``copy_kv_heads=False`` keeps the stricter rule). The vocabulary never blocks: it is
    padded (``padded_vocab_size``)."""
    try:
        whole_number(tp, "tp (the tensor-parallel degree)")
    except ValueError as err:
        return [str(err)]
    problems = head_problems(model, tp, copy_kv_heads)
    if model.d_ff % tp:
        problems.append(f"d_ff = {model.d_ff} cannot be split {tp} ways: each device needs an equal slice of "
                        "the MLP's hidden width")
    return problems


def kv_heads_per_device(model: ModelConfig, tp: int) -> float:
    """KV heads each of ``tp`` devices holds: ``n_kv_heads / tp``, or 1 once ``tp`` passes the KV heads
    (each head copied ``tp / n_kv_heads`` times)."""
    return max(model.n_kv_heads / whole_number(tp, "tp"), 1.0)


def kv_head_copies(model: ModelConfig, tp: int) -> int:
    """How many devices hold each KV head: 1 up to the KV-head count, ``tp / n_kv_heads`` past it. Each
    copy is paid twice: its k and v weights, and its KV cache, which stops shrinking past the count."""
    return max(1, whole_number(tp, "tp") // model.n_kv_heads)


def padded_vocab_size(model: ModelConfig, tp: int) -> int:
    """The vocabulary rounded up to a multiple of ``vocab_multiple x tp`` (Megatron-LM's
    ``make_vocab_size_divisible_by x tensor_model_parallel_size``), so each device gets an equal slice."""
    step = model.vocab_multiple * whole_number(tp, "tp")
    return -(-model.vocab_size // step) * step


def vocab_padding_bytes(model: ModelConfig, tp: int) -> float:
    """Bytes the padded rows add to the embedding and, when untied, the output head, all devices together
    (each holds ``1/tp`` of them)."""
    rows = padded_vocab_size(model, tp) - model.vocab_size
    return (1 if model.tied_embeddings else 2) * rows * model.d_model * model.bytes_per_param


def stage_layers(model: ModelConfig, pp: int) -> int:
    """Layers of the heaviest of ``pp`` stages: ``ceil(n_layers / pp)`` (stages may be uneven)."""
    return max(stage_layer_counts(model.n_layers, whole_number(pp, "pp")))


def kv_cache_bytes(model: ModelConfig, seq: int, batch: int = 1, tp: int = 1, cp: int = 1, pp: int = 1) -> float:
    """The KV cache on one device: a key and a value per layer of its stage (the heaviest,
    ``ceil(n_layers / pp)``), per KV head it holds (``kv_heads_per_device``), per token it keeps
    (``batch x seq / cp``), in the model's dtype; MLA's latent whole on every tp rank (vLLM's MLA)."""
    tokens = whole_number(batch, "batch") * whole_number(seq, "seq") / whole_number(cp, "cp")
    return model.kv_bytes_per_token(whole_number(tp, "tp"), stage_layers(model, pp)) * tokens


def attention_params_per_device(model: ModelConfig, tp: int) -> float:
    """One layer's attention weights on one of ``tp`` devices: q and o split ``tp`` ways, k and v over the
    KV heads each holds (``kv_heads_per_device``: copies past the KV-head count); MLA's split ``tp`` ways (its
    heads' up-projections dominate; the latent's down-projection, copied on every device, is counted split)."""
    if model.mla is not None:
        return model.attention_params_per_layer / whole_number(tp, "tp")
    return (2 * model.d_model * model.n_heads * model.head_dim / tp
            + 2 * model.d_model * model.head_dim * kv_heads_per_device(model, tp))


def layer_params_per_device(model: ModelConfig, tp: int, ep: int = 1) -> tuple[float, float, float]:
    """One layer's parameters on one GPU, ``(attention, experts, replicated)``: the attention's
    ``attention_params_per_device``; its ``n_experts / ep`` whole experts (``ep > 1``), or a ``1/tp`` slice of
    each (a dense MLP is one expert); the two norms and the router, whole on every GPU."""
    experts = model.n_experts * model.expert_params / (ep if ep > 1 else tp)
    replicated = 2 * model.d_model + (model.d_model * model.n_experts if model.is_moe else 0)
    return attention_params_per_device(model, tp), experts, replicated


def stage_params_per_device(model: ModelConfig, tp: int, pp: int, stage: int, ep: int = 1,
                            lighter_ends: bool = False) -> tuple[float, float]:
    """``(layer matrices, the rest)`` one GPU of ``stage`` holds, in parameters: its layers
    (``stage_layer_counts``, the ends a layer lighter with ``lighter_ends``) as ``layer_params_per_device``;
    the first stage also the embedding, the last the final norm and (untied) the head, ``1/tp`` of the padded
    vocabulary each. The memory model of both planners: serving reads it in bytes (``weights_per_gpu``),
    training keeps states for it (``training.memory.stage_params``)."""
    layers = stage_layer_counts(model.n_layers, whole_number(pp, "pp"), end_layers=int(lighter_ends))[stage]
    attention, experts, replicated = layer_params_per_device(model, tp, ep)
    table = padded_vocab_size(model, tp) / tp * model.d_model
    ends = (table if stage == 0 else 0.0) + ((model.d_model + (0 if model.tied_embeddings else table))
                                             if stage == pp - 1 else 0.0)
    return layers * (attention + experts), layers * replicated + ends


def pipeline_parallel_problems(model: ModelConfig, pp: int) -> list[str]:
    """Why ``model`` cannot be cut into ``pp`` pipeline stages (empty: it can). Stages may hold unequal
    layer counts (Llama 3 gives its first and last stages a layer fewer; vLLM accepts uneven stages): the
    slowest stage sets the pace. Only more stages than layers is refused."""
    try:
        whole_number(pp, "pp (the number of pipeline stages)")
    except ValueError as err:
        return [str(err)]
    if pp > model.n_layers:
        return [f"{model.n_layers} layers cannot fill {pp} stages: each stage needs at least one whole layer"]
    return []


def binding_rule(model: ModelConfig, tp: int) -> str:
    """Which of the shape rules stops ``tp`` (``"kv_heads"``, ``"query_heads"``, ``"d_ff"``), or ``""``
    when none does: the first in that order that ``tp`` breaks (KV heads copied where allowed)."""
    for problem, rule in ((model.n_kv_heads % tp and tp % model.n_kv_heads, "kv_heads"),
                          (model.n_heads % tp, "query_heads"), (model.d_ff % tp, "d_ff")):
        if problem:
            return rule
    return ""


def usable_tensor_parallel_degrees(model: ModelConfig, copy_kv_heads: bool = True) -> list[int]:
    """Every tp the shapes allow, from 1 up to the number of query heads."""
    return [tp for tp in range(1, model.n_heads + 1) if not tensor_parallel_problems(model, tp, copy_kv_heads)]


def check_tensor_parallel(model: ModelConfig, tp: int, copy_kv_heads: bool = False) -> None:
    """Raise ``ValueError`` naming every broken rule if ``model`` cannot be split ``tp`` ways. The check of
    code that splits real weights on ranks, which copies no KV heads unless ``copy_kv_heads``; the rule
    itself (copies allowed) is ``tensor_parallel_problems``."""
    problems = tensor_parallel_problems(model, tp, copy_kv_heads)
    if problems:
        usable = usable_tensor_parallel_degrees(model, copy_kv_heads)
        raise ValueError(f"{model.name} cannot use tp = {tp}: " + "; ".join(problems)
                         + f". Usable tp for {model.name}: {usable}")


@dataclass(frozen=True)
class Memory:
    """What one GPU holds to serve: its weights and its KV cache, in bytes."""

    weights_bytes: float
    kv_cache_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes
