"""``ModelConfig``: one transformer's shape, the one model config of the package.

Layers, widths, heads, experts, the context, the rotary and norm settings (``core.model`` reads them:
the toy has no rotary and norms in its own dtype; the served Llama rotates, and norms in float32 as
``transformers`` does), and the bytes a weight takes; the head rule every tensor-parallel split obeys
(``head_problems``, ``check_heads``). Presets of real models live in ``shardlib.facts.models``; what a
shape costs on devices in ``shardlib.predict.shapes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shardlib.core.checks import choice, flag, number_at_least, positive_number, whole_number

WEIGHT_BITS = (0, 8, 4)  # 0: weights in the model's dtype; 8 or 4: quantised matrices
SCALE_BYTES = 2  # one 16-bit scale per group of quantised weights


@dataclass(frozen=True)
class MLAShape:
    """Multi-head latent attention's ranks (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3, arXiv
    2412.19437, section 2.1.1). A token's keys and values come from one compressed latent of ``kv_rank``
    values, and every head shares one rotary key of ``rope_dim``: a token caches ``latent_dim`` values a layer,
    whatever the heads. Each head's query and key are ``nope_dim`` values without rotary and ``rope_dim`` with
    it; its value is ``v_dim``. The query comes through its own low-rank step of ``q_rank`` (0: straight from
    the hidden state). ``interleaved``: the checkpoint lays rotary pairs out as ``(x0, x1), (x2, x3), ...``
    (DeepSeek's) rather than in two halves."""

    kv_rank: int  # DeepSeek-V3: 512
    rope_dim: int  # 64
    nope_dim: int  # 128
    v_dim: int  # 128
    q_rank: int = 0  # 1536
    interleaved: bool = True

    def __post_init__(self) -> None:
        for name in ("kv_rank", "rope_dim", "nope_dim", "v_dim"):
            whole_number(getattr(self, name), f"MLA: {name}")
        whole_number(self.q_rank, "MLA: q_rank (0: no low-rank query)", minimum=0)
        if self.rope_dim % 2:
            raise ValueError(f"MLA: rope_dim {self.rope_dim} is odd; rotary turns pairs of values")
        flag(self.interleaved, "MLA: interleaved")

    latent_dim = property(lambda self: self.kv_rank + self.rope_dim)  # values a token caches a layer
    qk_dim = property(lambda self: self.nope_dim + self.rope_dim)  # one head's query and key

    def attention_params(self, d_model: int, n_heads: int) -> int:
        """One layer's matrices: the query's steps, the joint down-projection, K and V up, the output (the two
        small norms' vectors left out)."""
        q = self.q_rank * (d_model + n_heads * self.qk_dim) if self.q_rank else d_model * n_heads * self.qk_dim
        return (q + d_model * self.latent_dim + self.kv_rank * n_heads * (self.nope_dim + self.v_dim)
                + n_heads * self.v_dim * d_model)


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
    node_limit: int = 0  # 0: a token's experts anywhere; else on at most this many nodes (DeepSeek-V3: 4)
    max_positions: int = 0  # the longest sequence the model serves (0: not set, the toy's)
    rope_theta: float = 0.0  # rotary base (Llama: 10000); 0: no rotary, the toy's
    rms_eps: float = 0.0  # RMSNorm's epsilon; 0: the computing dtype's machine epsilon, the toy's
    norm_float32: bool = False  # RMSNorm computed in float32 and cast back, as transformers' Llama does
    router_gate: str = "softmax-topk"  # with experts: the router's gate function (core.experts.routing.GATES)
    mla: MLAShape | None = None  # multi-head latent attention (DeepSeek-V2/V3); None: grouped-query attention
    expert_d_ff: int = 0  # 0: d_ff; else each routed expert's width (DeepSeek-V3: 2048; its dense layers 18432)
    shared_experts: int = 0  # experts every token runs, beside its routed ones, expert_d_ff wide each (DeepSeek-V3: 1)
    dense_layers: int = 0  # the first layers keep a dense MLP of d_ff (DeepSeek-V3: 3)
    routed_scale: float = 1.0  # the routed experts' gates times this (DeepSeek-V3: 2.5)
    expert_groups: int = 1  # routed experts in groups, a token on at most node_limit of them (DeepSeek-V3: 8)
    router_float32: bool = False  # the router's scores in float32 whatever the model's dtype (DeepSeek-V3's)

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
        whole_number(self.node_limit, f"{self.name}: node_limit (0: unlimited routing)", minimum=0)
        whole_number(self.max_positions, f"{self.name}: max_positions (0: not set)", minimum=0)
        number_at_least(self.rope_theta, f"{self.name}: rope_theta (0: no rotary)")
        number_at_least(self.rms_eps, f"{self.name}: rms_eps (0: the dtype's epsilon)")
        flag(self.norm_float32, f"{self.name}: norm_float32")
        whole_number(self.expert_d_ff, f"{self.name}: expert_d_ff (0: d_ff)", minimum=0)
        whole_number(self.shared_experts, f"{self.name}: shared_experts", minimum=0)
        whole_number(self.dense_layers, f"{self.name}: dense_layers", minimum=0)
        positive_number(self.routed_scale, f"{self.name}: routed_scale")
        whole_number(self.expert_groups, f"{self.name}: expert_groups")
        flag(self.router_float32, f"{self.name}: router_float32")
        if self.n_experts % self.expert_groups or (self.expert_groups > 1 and not 1 <= self.node_limit
                                                   <= self.expert_groups):
            raise ValueError(f"{self.name}: {self.n_experts} experts in {self.expert_groups} groups, a token on "
                             f"{self.node_limit} of them: the groups must split the experts evenly and a token "
                             "reach between 1 and all of them")

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
        """q and o over the query heads, k and v over the KV heads; with MLA, its low-rank projections."""
        if self.mla is not None:
            return self.mla.attention_params(self.d_model, self.n_heads)
        q_and_o = 2 * self.d_model * self.n_heads * self.head_dim
        k_and_v = 2 * self.d_model * self.n_kv_heads * self.head_dim
        return q_and_o + k_and_v

    @property
    def kv_latent_dim(self) -> int:
        """Values a token caches a layer with MLA (its latent and shared rotary key); 0 without."""
        return self.mla.latent_dim if self.mla is not None else 0

    @property
    def expert_width(self) -> int:
        """A routed expert's hidden width: ``expert_d_ff``, or ``d_ff`` when that is 0."""
        return self.expert_d_ff or self.d_ff

    @property
    def expert_params(self) -> int:
        """One expert's gated MLP (up, gate, down)."""
        return 3 * self.d_model * self.expert_width

    @property
    def params_per_layer(self) -> int:
        router = self.d_model * self.n_experts if self.is_moe else 0
        norms = 2 * self.d_model
        return self.attention_params_per_layer + self.n_experts * self.expert_params + router + norms

    @property
    def n_params(self) -> int:
        """Every layer, the token embedding, the output head when it is not tied to it, the final norm."""
        tables = 1 if self.tied_embeddings else 2
        return self.n_layers * self.params_per_layer + tables * self.vocab_size * self.d_model + self.d_model

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
    def weight_bytes(self) -> float:
        """Every weight in bytes: layer matrices (attention projections, every expert's MLP: what quantising
        shrinks) at ``matrix_bytes_per_param``, the rest (norms, router, embeddings, head) in the model's
        dtype. Unquantised: ``n_params x bytes_per_param``."""
        matrices = self.n_layers * (self.attention_params_per_layer + self.n_experts * self.expert_params)
        return matrices * self.matrix_bytes_per_param + (self.n_params - matrices) * self.bytes_per_param

    def kv_bytes_per_token(self, tp: int = 1, n_layers: int | None = None) -> float:
        """KV cache one token adds on one of ``tp`` ranks, over ``n_layers`` (default: all), in the model's
        dtype (``kv_bytes_per_token`` below)."""
        layers = self.n_layers if n_layers is None else n_layers
        return kv_bytes_per_token(layers, self.n_kv_heads, self.head_dim, self.bytes_per_param, tp, self.kv_latent_dim)


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, element_bytes: float, tp: int = 1,
                       latent_dim: int = 0) -> float:
    """The one KV-cache formula: what one token adds on one of ``tp`` ranks. A key and a value per layer
    per KV head the rank holds (``n_kv_heads / tp``, one copy each once ``tp`` passes them); with multi-head
    latent attention (DeepSeek-V2/V3) its ``latent_dim`` values per layer instead, whole on every rank."""
    per_layer = latent_dim or 2 * max(n_kv_heads / tp, 1) * head_dim
    return n_layers * per_layer * element_bytes



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


def check_heads(model: ModelConfig, tp: int, copy_kv_heads: bool = False) -> None:
    """A ValueError naming the head rule ``tp`` breaks, if it breaks one (only the attention's rule:
    for one attention block, not a whole model)."""
    problems = head_problems(model, whole_number(tp, "tp"), copy_kv_heads)
    if problems:
        raise ValueError("; ".join(problems))
