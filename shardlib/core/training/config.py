"""``TrainingConfig``: the toy language model and its training step, and the model's seeded weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import choice, number_at_least, positive_number, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.experts.dispatch import moe_stack_weights
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.pipeline.registry import SCHEDULES
from shardlib.core.toy import generator, stack_weights, weight

DTYPES = {"float32": torch.float32, "float64": torch.float64}
BALANCES = ("aux-loss", "aux-free")


@dataclass(frozen=True)
class TrainingConfig:
    """One training run of the toy language model: sizes, batch, optimizer, seed, dtype."""

    n_layers: int = 4
    d_model: int = 32
    n_heads: int = 4
    n_kv_heads: int = 2
    d_ff: int = 64
    vocab_size: int = 64
    seq: int = 16  # tokens per sequence
    microbatch: int = 2  # sequences per microbatch, per replica
    m: int = 2  # microbatches per step (gradient accumulation; the pipeline's microbatches)
    steps: int = 3
    lr: float = 1e-2
    weight_decay: float = 0.01
    successors: int = 3  # likely next tokens per token in the corpus
    seed: int = 0
    dtype: str = "float32"
    schedule: str = "1f1b"  # the pipeline schedule, a name of the registry (``core.pipeline.schedules.SCHEDULES``)
    chunks: int = 1  # model chunks per pipeline rank (interleaved 1F1B: 2 or more; the V schedules take 2)
    n_experts: int = 1  # 1: a dense MLP per block; more: a dropless MoE layer of that many experts
    experts_per_token: int = 1  # k, the experts each token goes to
    balance: str = "aux-loss"  # "aux-loss" (Switch) or "aux-free" (DeepSeek-V3's bias)
    aux_loss_coef: float = 0.01  # Switch's alpha
    bias_rate: float = 0.01  # DeepSeek-V3's gamma (1e-3 there; a toy trained a few steps needs more)

    def __post_init__(self) -> None:
        for name in ("seq", "microbatch", "m", "steps", "successors", "chunks"):
            whole_number(getattr(self, name), name)
        whole_number(self.seed, "seed", 0)
        positive_number(self.lr, "lr (AdamW's learning rate)")
        number_at_least(self.weight_decay, "weight_decay")
        choice(self.dtype, tuple(DTYPES), "dtype")
        choice(self.schedule, tuple(SCHEDULES), "schedule (a pipeline schedule)")
        choice(self.balance, BALANCES, "balance (how the experts' load is balanced)")
        number_at_least(self.aux_loss_coef, "aux_loss_coef (Switch's alpha)")
        positive_number(self.bias_rate, "bias_rate (the selection bias's step)")
        self.model  # the shapes' own checks: whole numbers, heads that divide, at most n_experts per token
        if self.successors > self.vocab_size:
            raise ValueError(f"each token cannot have {self.successors} likely successors in a vocabulary of "
                             f"{self.vocab_size}")

    @property
    def model(self) -> ModelConfig:
        """The blocks' shapes, as the toy's ``ModelConfig`` (what ``toy.stack_weights`` reads)."""
        return ModelConfig("the toy language model", n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, d_ff=self.d_ff, vocab_size=self.vocab_size,
                           bytes_per_param=float(self.element_bytes), n_experts=self.n_experts,
                           experts_per_token=self.experts_per_token)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def moe(self):
        """The MoE layer's configuration (``core.experts.routing.MoEConfig``: Mixtral's softmax over the top k)."""
        return MoEConfig(n_experts=self.n_experts, k=self.experts_per_token, d_model=self.d_model,
                              d_ff=self.d_ff, balance=self.balance, aux_loss_coef=float(self.aux_loss_coef),
                              bias_rate=float(self.bias_rate))

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def element_bytes(self) -> int:
        return 8 if self.dtype == "float64" else 4

    def global_batch(self, dp: int = 1) -> int:
        """Sequences per step: ``microbatch x m x dp``."""
        return self.microbatch * self.m * whole_number(dp, "dp")

    def global_tokens(self, dp: int = 1) -> int:
        """Tokens per step: the global batch times ``seq``; the loss is their mean."""
        return self.global_batch(dp) * self.seq

    def batch_text(self, dp: int = 1) -> str:
        """The global-batch accounting, in words."""
        return (f"global batch = microbatch x m x dp = {self.microbatch} x {self.m} x {dp} = "
                f"{self.global_batch(dp)} sequences = {self.global_tokens(dp)} tokens of {self.seq} per sequence")


def init_weights(config: TrainingConfig) -> dict[str, torch.Tensor]:
    """The model's seeded weights, in ``config.dtype``: the blocks from ``toy.stack_weights``, then the
    embedding (unit normal rows) and the head (scaled by ``1/sqrt(d)``) from a second generator."""
    stack = moe_stack_weights(config.model, config.seed) if config.is_moe else stack_weights(config.model, config.seed)
    out = {f"layers.{i}.{name}": w for i, layer in enumerate(stack) for name, w in layer.items()}
    g = generator(config.seed + 1)
    out["embed"] = torch.randn(config.vocab_size, config.d_model, generator=g)
    out["head"] = weight(g, config.vocab_size, config.d_model)
    return {k: v.to(config.torch_dtype) for k, v in out.items()}


def layer_of(weights: dict, i: int) -> dict[str, torch.Tensor]:
    """Layer ``i``'s weights, by their short names (``q``, ``gate`` ...)."""
    prefix = f"layers.{i}."
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
