"""Model shapes: ``ModelConfig`` and presets of real public models, from their published configs.

Only shapes live here (layers, widths, heads, experts, bytes per parameter), never weights: enough to
count parameters and bytes, and to decide which splits a model allows. Pure: no torch.distributed.

Parameter counting follows the Llama/Mixtral architecture: per layer, attention projections
``q, o: d_model x (n_heads * head_dim)`` and ``k, v: d_model x (n_kv_heads * head_dim)``, a gated MLP of
three ``d_model x d_ff`` matrices per expert, a router ``d_model x n_experts`` when there are experts,
and two RMSNorm weight vectors; plus the token embedding, a final norm, and an untied output head.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .checks import positive_number, whole_number


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

    # -- counts -------------------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def attention_params_per_layer(self) -> int:
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
    def weight_bytes(self) -> float:
        return self.n_params * self.bytes_per_param

    @property
    def usable_tp(self) -> list[int]:
        """The tensor-parallel degrees this model's shapes allow (see ``tensor_parallel_problems``)."""
        return usable_tensor_parallel_degrees(self)


# -- which tensor-parallel degrees a model's shapes allow -----------------------------------------------
def tensor_parallel_problems(model: ModelConfig, tp: int) -> list[str]:
    """Every reason ``model`` cannot be split ``tp`` ways by tensor parallelism (empty: it can).

    Tensor parallelism gives each device whole attention heads (query heads and, because a query head
    needs its KV head on the same device, whole KV heads), an equal slice of the MLP's hidden width
    ``d_ff``, and an equal slice of the vocabulary for the embedding and output head. Serving systems
    sometimes pad the vocabulary or replicate KV heads to go further; this rule is the plain one.
    """
    try:
        whole_number(tp, "tp (the tensor-parallel degree)")
    except ValueError as err:
        return [str(err)]
    problems = head_problems(model, tp)
    if model.d_ff % tp:
        problems.append(f"d_ff = {model.d_ff} cannot be split {tp} ways: each device needs an equal slice of "
                        "the MLP's hidden width")
    if model.vocab_size % tp:
        problems.append(f"vocab_size = {model.vocab_size} cannot be split {tp} ways: each device needs an equal "
                        "slice of the vocabulary")
    return problems


def head_problems(model: ModelConfig, tp: int) -> list[str]:
    """The attention part of the rule: each device needs whole query heads and the whole KV heads
    they read."""
    problems = []
    if model.n_kv_heads % tp:
        problems.append(f"{model.n_kv_heads} KV heads cannot be split {tp} ways: tensor parallelism gives each "
                        "device whole KV heads")
    if model.n_heads % tp:
        problems.append(f"{model.n_heads} query heads cannot be split {tp} ways: each device needs whole heads")
    return problems


def check_heads(model: ModelConfig, tp: int) -> None:
    """A ValueError naming the head rule ``tp`` breaks, if it breaks one (only the attention's rule:
    for one attention block, not a whole model)."""
    problems = head_problems(model, whole_number(tp, "tp"))
    if problems:
        raise ValueError("; ".join(problems))


def usable_tensor_parallel_degrees(model: ModelConfig) -> list[int]:
    """Every tp the shapes allow, from 1 up (at most the number of KV heads)."""
    return [tp for tp in range(1, model.n_kv_heads + 1) if not tensor_parallel_problems(model, tp)]


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """Raise ``ValueError`` naming every broken rule if ``model`` cannot be split ``tp`` ways."""
    problems = tensor_parallel_problems(model, tp)
    if problems:
        usable = usable_tensor_parallel_degrees(model)
        raise ValueError(f"{model.name} cannot use tp = {tp}: " + "; ".join(problems)
                         + f". Usable tp for {model.name}: {usable}")


# Facts from each model's published config.json (hidden_size, num_hidden_layers, num_attention_heads,
# num_key_value_heads, intermediate_size, vocab_size, num_local_experts, num_experts_per_tok).
LLAMA_3_8B = ModelConfig("Llama-3-8B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                         vocab_size=128256)
LLAMA_3_70B = ModelConfig("Llama-3-70B", n_layers=80, d_model=8192, n_heads=64, n_kv_heads=8, d_ff=28672,
                          vocab_size=128256)
MIXTRAL_8X7B = ModelConfig("Mixtral-8x7B", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8, d_ff=14336,
                           vocab_size=32000, n_experts=8, experts_per_token=2)
# Small enough to run for real on a laptop's CPU ranks, shaped like the real ones (GQA, gated MLP).
TOY = ModelConfig("toy", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=256, vocab_size=512,
                  bytes_per_param=4.0)
TOY_MOE = ModelConfig("toy-moe", n_layers=4, d_model=64, n_heads=8, n_kv_heads=4, d_ff=128, vocab_size=512,
                      n_experts=8, experts_per_token=2, bytes_per_param=4.0)

PRESETS: dict[str, ModelConfig] = {m.name: m for m in (LLAMA_3_8B, LLAMA_3_70B, MIXTRAL_8X7B, TOY, TOY_MOE)}

