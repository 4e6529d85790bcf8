"""Model shapes: ``ModelConfig`` and presets of real public models, from their published configs.

Only shapes (layers, widths, heads, experts, bytes per parameter), never weights: enough to count
parameters and bytes and to decide which splits a model allows. Parameters are counted as in the
Llama/Mixtral architecture (attention ``q, o: d_model x heads * head_dim``, ``k, v`` over the KV heads, a
gated MLP of three ``d_model x d_ff`` matrices per expert, a router, two norms per layer; embedding, final
norm and an untied head). ``quantized(bits)`` stores the layers' matrices as GPTQ/AWQ do (Frantar et al.
2023; Lin et al. 2024): groups of 128 weights with one 16-bit scale, ``bits + 16 / 128`` bits a weight.
Also here, one home each: the tensor-parallel shape rules and what passing a wall costs (KV heads
copied, the vocabulary padded), KV heads per device and KV-cache bytes, uneven pipeline stages. One idea:
what a model's shape alone says, before any device is chosen. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .checks import choice, near_equal_parts, positive_number, whole_number

WEIGHT_BITS = (0, 8, 4)  # 0: weights in the model's dtype; 8 or 4: quantised matrices
SCALE_BYTES = 2  # one 16-bit scale per group of quantised weights


@dataclass(frozen=True)
class ModelConfig:
    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    n_experts: int = 1  # 1 means a dense MLP
    experts_per_token: int = 1
    bytes_per_param: float = 2.0  # fp16 / bf16
    head_dim: int = field(default=0)  # 0: d_model // n_heads
    tied_embeddings: bool = False
    weight_bits: int = 0  # 0: weights in bytes_per_param; 8 or 4: layer matrices quantised (see quantized)
    quant_group_size: int = 128  # weights that share one 16-bit scale
    vocab_multiple: int = 128  # the vocabulary is padded to a multiple of this x tp (Megatron-LM's default)
    attention_params: int = 0  # 0: counted from the heads; else one layer's attention weights as given (MLA)
    kv_latent_dim: int = 0  # 0: a key and a value per KV head; else values one token caches per layer (MLA)
    node_limit: int = 0  # 0: a token's experts anywhere; else on at most this many nodes (DeepSeek-V3: 4)

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "n_experts",
                     "experts_per_token"):
            whole_number(getattr(self, name), f"{self.name}: {name}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"{self.name}: {self.n_heads} query heads cannot share {self.n_kv_heads} KV heads evenly "
                f"(grouped-query attention needs n_heads to be a multiple of n_kv_heads)"
            )
        if self.head_dim == 0:
            if self.d_model % self.n_heads:
                raise ValueError(
                    f"{self.name}: d_model {self.d_model} does not divide into {self.n_heads} heads; "
                    "give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.d_model // self.n_heads)
        if self.experts_per_token > self.n_experts:
            raise ValueError(
                f"{self.name}: each token cannot use {self.experts_per_token} experts when there are "
                f"only {self.n_experts}"
            )
        positive_number(self.bytes_per_param, f"{self.name}: bytes_per_param")
        choice(self.weight_bits, WEIGHT_BITS, f"{self.name}: weight_bits")
        whole_number(self.quant_group_size, f"{self.name}: quant_group_size")
        whole_number(self.vocab_multiple, f"{self.name}: vocab_multiple")
        whole_number(self.attention_params, f"{self.name}: attention_params (0: counted from the heads)", minimum=0)
        whole_number(self.kv_latent_dim, f"{self.name}: kv_latent_dim (0: keys and values per KV head)", minimum=0)
        whole_number(self.node_limit, f"{self.name}: node_limit (0: unlimited routing)", minimum=0)

    def quantized(self, bits: int, group_size: int = 128) -> "ModelConfig":
        """The same model with its layer matrices stored in ``bits`` (8 or 4) bits per weight plus one
        16-bit scale per ``group_size`` weights; activations, KV cache, embeddings and norms unchanged."""
        choice(bits, WEIGHT_BITS[1:], "bits (quantised weights)")
        return replace(self, name=f"{self.name} {bits}-bit", weight_bits=bits,
                       quant_group_size=whole_number(group_size, "group_size"))

    # -- counts -------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def attention_params_per_layer(self) -> int:
        """q and o over the query heads, k and v over the KV heads; or ``attention_params`` where the
        attention is not shaped so (DeepSeek's MLA: low-rank projections)."""
        if self.attention_params:
            return self.attention_params
        q_and_o = 2 * self.d_model * self.n_heads * self.head_dim
        k_and_v = 2 * self.d_model * self.n_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (up, gate, down)."""
        return 3 * self.d_model * self.d_ff

    @property
    def params_per_layer(self) -> int:
        router = self.d_model * self.n_experts if self.is_moe else 0
        norms = 2 * self.d_model
        return self.attention_params_per_layer + self.n_experts * self.expert_params + router + norms

    @property
    def embedding_params(self) -> int:
        """Token embedding, plus the output head when it is not tied to it, plus the final norm."""
        copies = 1 if self.tied_embeddings else 2
        return copies * self.vocab_size * self.d_model + self.d_model

    @property
    def n_params(self) -> int:
        return self.n_layers * self.params_per_layer + self.embedding_params

    @property
    def active_params_per_token(self) -> int:
        """Parameters one token touches: only ``experts_per_token`` of the experts fire."""
        idle_experts = self.n_experts - self.experts_per_token
        return self.n_params - self.n_layers * idle_experts * self.expert_params

    @property
    def matrix_bytes_per_param(self) -> float:
        """Bytes per weight of the layer matrices (attention projections, experts): the model's dtype, or
        ``bits / 8`` plus each group's share of its 16-bit scale when quantised."""
        if not self.weight_bits:
            return self.bytes_per_param
        return self.weight_bits / 8 + SCALE_BYTES / self.quant_group_size

    @property
    def matrix_params_per_layer(self) -> int:
        """The quantisable part of a layer: attention projections and every expert's MLP."""
        return self.attention_params_per_layer + self.n_experts * self.expert_params

    @property
    def weight_bytes(self) -> float:
        """Every weight in bytes: layer matrices at ``matrix_bytes_per_param``, the rest (norms, router,
        embeddings, head) in the model's dtype. Unquantised: ``n_params x bytes_per_param``."""
        matrices = self.n_layers * self.matrix_params_per_layer
        return matrices * self.matrix_bytes_per_param + (self.n_params - matrices) * self.bytes_per_param

    def kv_bytes_per_token(self) -> float:
        """KV cache one token adds: a key and a value per KV head per layer (MLA: its ``kv_latent_dim``
        values per layer), in the model's dtype."""
        per_layer = self.kv_latent_dim or 2 * self.n_kv_heads * self.head_dim
        return self.n_layers * per_layer * self.bytes_per_param

    @property
    def usable_tp(self) -> list[int]:
        """The tensor-parallel degrees this model's shapes allow (see ``tensor_parallel_problems``)."""
        return usable_tensor_parallel_degrees(self)


# -- which tensor-parallel degrees a model's shapes allow, and what each costs --------------------------
def tensor_parallel_problems(model: ModelConfig, tp: int, copy_kv_heads: bool = True) -> list[str]:
    """Every reason ``model`` cannot be split ``tp`` ways by tensor parallelism (empty: it can).

    Each device gets whole query heads, an equal slice of the MLP's hidden width ``d_ff``, and whole KV
    heads (a query head needs its KV head on the same device): ``tp`` divides the KV heads, or, past them,
    is a multiple of them and each KV head is copied on ``tp / n_kv_heads`` devices (vLLM's way; the cost
    is ``kv_head_copies``). ``copy_kv_heads=False`` keeps the stricter rule of code that only splits KV
    heads. The vocabulary never blocks: it is padded to a multiple of ``vocab_multiple x tp`` (``padded_vocab_size``).
    """
    try:
        whole_number(tp, "tp (the tensor-parallel degree)")
    except ValueError as err:
        return [str(err)]
    problems = head_problems(model, tp, copy_kv_heads)
    if model.d_ff % tp:
        problems.append(f"d_ff = {model.d_ff} cannot be split {tp} ways: each device needs an equal slice of "
                        "the MLP's hidden width")
    return problems


def head_problems(model: ModelConfig, tp: int, copy_kv_heads: bool = False) -> list[str]:
    """The attention part of the rule: each device needs whole query heads and the whole KV heads they
    read; with ``copy_kv_heads``, a ``tp`` that is a multiple of the KV heads copies each of them."""
    problems = []
    copied = copy_kv_heads and tp > model.n_kv_heads and tp % model.n_kv_heads == 0
    if model.n_kv_heads % tp and not copied:
        problems.append(
            f"{model.n_kv_heads} KV heads cannot be shared by {tp} devices: tp must divide the KV heads (each "
            f"device holds whole KV heads) or be a multiple of them (each KV head copied on tp / "
            f"{model.n_kv_heads} devices)" if copy_kv_heads else
            f"{model.n_kv_heads} KV heads cannot be split {tp} ways: this code gives each device whole KV heads "
            "and copies none")
    if model.n_heads % tp:
        problems.append(f"{model.n_heads} query heads cannot be split {tp} ways: each device needs whole heads")
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
    return max(near_equal_parts(model.n_layers, whole_number(pp, "pp")))


def kv_cache_bytes(model: ModelConfig, seq: int, batch: int = 1, tp: int = 1, cp: int = 1, pp: int = 1) -> float:
    """The KV cache on one device: a key and a value per layer of its stage (the heaviest,
    ``ceil(n_layers / pp)``), per KV head it holds (``kv_heads_per_device``), per token it keeps
    (``batch x seq / cp``), in the model's dtype."""
    tokens = whole_number(batch, "batch") * whole_number(seq, "seq") / whole_number(cp, "cp")
    if model.kv_latent_dim:  # MLA: one latent per token per layer, whole on every tp rank (vLLM's MLA)
        return stage_layers(model, pp) * model.kv_latent_dim * model.bytes_per_param * tokens
    per_token = 2 * stage_layers(model, pp) * kv_heads_per_device(model, tp) * model.head_dim * model.bytes_per_param
    return per_token * tokens


def attention_params_per_device(model: ModelConfig, tp: int) -> float:
    """One layer's attention weights on one of ``tp`` devices: q and o split ``tp`` ways, k and v over the
    KV heads each holds (``kv_heads_per_device``: copies past the KV-head count); a model that gives
    ``attention_params`` (MLA) splits them ``tp`` ways (its heads' up-projections dominate)."""
    if model.attention_params:
        return model.attention_params / whole_number(tp, "tp")
    return (2 * model.d_model * model.n_heads * model.head_dim / tp
            + 2 * model.d_model * model.head_dim * kv_heads_per_device(model, tp))


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


def check_heads(model: ModelConfig, tp: int, copy_kv_heads: bool = False) -> None:
    """A ValueError naming the head rule ``tp`` breaks, if it breaks one (only the attention's rule:
    for one attention block, not a whole model)."""
    problems = head_problems(model, whole_number(tp, "tp"), copy_kv_heads)
    if problems:
        raise ValueError("; ".join(problems))


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


# Facts from each model's published config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size, num_local_experts, num_experts_per_tok). Llama-3.1-405B:
# 405.9 B parameters by this count, "405B" as published.
LLAMA_3_8B = ModelConfig("Llama-3-8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                         vocab_size=128256)
LLAMA_3_70B = ModelConfig("Llama-3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672,
                          vocab_size=128256)
# Llama 3.1 8B and 70B: Llama 3's shapes, with a 128K context (their config.json differ in rope scaling only).
LLAMA_3_1_8B = replace(LLAMA_3_8B, name="Llama-3.1-8B")
LLAMA_3_1_70B = replace(LLAMA_3_70B, name="Llama-3.1-70B")
LLAMA_3_1_405B = ModelConfig("Llama-3.1-405B", n_layers=126, d_model=16384, n_heads=128, n_kv_heads=8,
                             d_ff=53248, vocab_size=128256)
MIXTRAL_8X7B = ModelConfig("Mixtral-8x7B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                           vocab_size=32000, n_experts=8, experts_per_token=2)
# DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", arXiv 2412.19437, sections 2 and 4.2; its
# published config, deepseek-ai/DeepSeek-V3 config.json / inference/configs/config_671B.json): 61 layers,
# hidden_size 7168, 128 heads (MLA: qk_nope_head_dim 128 + qk_rope_head_dim 64, v_head_dim 128, q_lora_rank
# 1536, kv_lora_rank 512), n_routed_experts 256, num_experts_per_tok 8, moe_intermediate_size 2048,
# n_shared_experts 1, first_k_dense_replace 3 (dense layers of intermediate_size 18432), vocab_size 129280,
# untied head; 671B parameters, 37B active per token (the report's abstract). What this ModelConfig cannot say,
# and how it approximates it:
# * MLA: ``attention_params`` is MLA's own count per layer, 7168 x 1536 + 1536 x 128 x 192 + 7168 x 576 +
#   512 x 128 x 256 + 128 x 128 x 7168 = 187,105,280 (q down and up, the joint KV down-projection with the
#   shared RoPE key, k and v up, o); ``kv_latent_dim`` 576: a token caches its compressed latent (512) and
#   its RoPE key (64) per layer, not 128 keys and values (2 x 128 x 128). n_kv_heads = 128: the heads MLA's
#   up-projection makes, so tp up to 128 splits whole heads.
# * Node-limited routing (section 2.1.2): ``node_limit`` 4, each token's experts on at most 4 nodes.
# * The 3 dense first layers count as MoE layers (+32.6B) and the shared expert is left out (-2.6B): 701B by
#   this count, 34.9B active per token (published 671B and 37B). The multi-token-prediction module (14B)
#   is left out too, as the 671B does.
DEEPSEEK_V3 = ModelConfig("DeepSeek-V3", n_layers=61, d_model=7168, n_heads=128, n_kv_heads=128, head_dim=128,
                          d_ff=2048, vocab_size=129280, n_experts=256, experts_per_token=8,
                          attention_params=7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256
                          + 128 * 128 * 7168, kv_latent_dim=512 + 64, node_limit=4)
# Small enough to run for real on a laptop's CPU ranks, shaped like the real ones (GQA, gated MLP).
TOY = ModelConfig("toy", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=256, vocab_size=512,
                  bytes_per_param=4.0)
TOY_MOE = ModelConfig("toy-moe", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=512,
                      n_experts=8, experts_per_token=2, bytes_per_param=4.0)

PRESETS: dict[str, ModelConfig] = {m.name: m for m in (LLAMA_3_8B, LLAMA_3_70B, LLAMA_3_1_405B, MIXTRAL_8X7B, TOY,
                                                        TOY_MOE)}

# Made-up models, each showing a rule other than the KV heads: GPT-2's odd vocabulary (padded, a cost), an MLP
# width of 8,190 that 4 does not divide (a refusal), 30 layers that 4 or 8 stages cut unevenly (a cost).
SHAPE_RULE_EXAMPLES: dict[str, ModelConfig] = {
    "vocab": ModelConfig("odd-vocab-1B", n_layers=24, d_model=2048, n_heads=16, n_kv_heads=8, d_ff=8192,
                         vocab_size=50257),
    "d_ff": ModelConfig("odd-mlp-1B", n_layers=24, d_model=2048, n_heads=16, n_kv_heads=8, d_ff=8190,
                        vocab_size=32000),
    "layers": ModelConfig("30-layer-7B", n_layers=30, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                          vocab_size=32000),
}


@dataclass(frozen=True)
class Memory:
    """What one GPU holds to serve: its weights and its KV cache, in bytes."""

    weights_bytes: float
    kv_cache_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.kv_cache_bytes
