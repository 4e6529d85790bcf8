"""What the toy language model learns from, and how big one step is: ``TrainingConfig`` and the corpus.

``TrainingConfig``: the model's sizes, the vocabulary, the sequence, the microbatch, ``m`` microbatches
per step, the steps, AdamW's hyper-parameters, the seed, the dtype, and the pipeline schedule (a registry
name, with its model chunks per rank). ``n_experts > 1`` makes every block's MLP a dropless MoE layer
(``experts.dropless``) of ``n_experts`` experts of width ``d_ff``, ``experts_per_token`` per token, balanced by
Switch's auxiliary loss (``"aux-loss"``, ``aux_loss_coef`` times it, per microbatch) or DeepSeek-V3's selection
bias (``"aux-free"``, moved by ``bias_rate`` after each step). The global batch is
``microbatch x m x dp`` sequences (``global_batch``), each of ``seq`` tokens.
``MarkovCorpus``: a seeded sparse Markov chain over the vocabulary (each token has a few likely
successors), so a model can learn it: the loss starts near ``ln(V)`` (uniform guessing) and falls
towards the chain's entropy per token (``entropy_nats``), the least any model can reach. Every step
draws its own batch from a generator seeded by ``(seed, step)``: the reference and every rank read the
same tokens. Torch only, no ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..checks import choice, positive_number, whole_number
from ..experts.gating import MoETrainConfig
from ..models import ModelConfig
from ..pipeline.schedules import SCHEDULES

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
    schedule: str = "1f1b"  # the pipeline schedule, a name of the registry (``pipeline.schedules.SCHEDULES``)
    chunks: int = 1  # model chunks per pipeline rank (interleaved 1F1B: 2 or more; the V schedules take 2)
    n_experts: int = 1  # 1: a dense MLP per block; more: a dropless MoE layer of that many experts
    experts_per_token: int = 1  # k, the experts each token goes to
    balance: str = "aux-loss"  # "aux-loss" (Switch) or "aux-free" (DeepSeek-V3's bias)
    aux_loss_coef: float = 0.01  # Switch's alpha
    bias_rate: float = 0.01  # DeepSeek-V3's gamma (1e-3 there; a toy trained a few steps needs more)

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff", "vocab_size", "seq", "microbatch",
                     "m", "steps", "successors", "chunks"):
            whole_number(getattr(self, name), name)
        whole_number(self.seed, "seed", 0)
        positive_number(self.lr, "lr (AdamW's learning rate)")
        if not isinstance(self.weight_decay, (int, float)) or self.weight_decay < 0:
            raise ValueError(f"weight_decay must be a number of 0 or more, got {self.weight_decay!r}")
        choice(self.dtype, tuple(DTYPES), "dtype")
        choice(self.schedule, tuple(SCHEDULES), "schedule (a pipeline schedule)")
        whole_number(self.n_experts, "n_experts (1: a dense MLP)")
        whole_number(self.experts_per_token, "experts_per_token (k)")
        if self.experts_per_token > self.n_experts:
            raise ValueError(f"each token cannot go to experts_per_token = {self.experts_per_token} experts when "
                             f"there are n_experts = {self.n_experts}")
        choice(self.balance, BALANCES, "balance (how the experts' load is balanced)")
        if not isinstance(self.aux_loss_coef, (int, float)) or self.aux_loss_coef < 0:
            raise ValueError(f"aux_loss_coef must be a number of 0 or more, got {self.aux_loss_coef!r}")
        positive_number(self.bias_rate, "bias_rate (the selection bias's step)")
        if self.successors > self.vocab_size:
            raise ValueError(f"each token cannot have {self.successors} likely successors in a vocabulary of "
                             f"{self.vocab_size}")
        self.model  # the block shapes' own checks (heads divide d_model, KV heads divide heads)

    @property
    def model(self) -> ModelConfig:
        """The blocks' shapes, as the toy's ``ModelConfig`` (what ``toy.stack_weights`` reads)."""
        return ModelConfig("toy-lm", n_layers=self.n_layers, d_model=self.d_model, n_heads=self.n_heads,
                           n_kv_heads=self.n_kv_heads, d_ff=self.d_ff, vocab_size=self.vocab_size,
                           bytes_per_param=float(self.element_bytes), n_experts=self.n_experts,
                           experts_per_token=self.experts_per_token)

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 1

    @property
    def moe(self):
        """The MoE layer's configuration (``experts.gating.MoETrainConfig``: Mixtral's softmax over the top k)."""
        return MoETrainConfig(n_experts=self.n_experts, k=self.experts_per_token, d_model=self.d_model,
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


class MarkovCorpus:
    """A sparse random Markov chain over ``vocab_size`` tokens: each token's next token is one of
    ``successors`` likely tokens (weights drawn once) or, rarely, any token."""

    def __init__(self, config: TrainingConfig, noise: float = 0.05) -> None:
        self.config = config
        v, k = config.vocab_size, config.successors
        g = torch.Generator().manual_seed(config.seed + 7919)
        probs = torch.full((v, v), noise / v, dtype=torch.float64)
        for row in range(v):
            nxt = torch.randperm(v, generator=g)[:k]
            probs[row, nxt] += (1 - noise) * _simplex(g, k)
        self.transition = probs / probs.sum(1, keepdim=True)  # (V, V): row a is P(next | a)

    @property
    def entropy_nats(self) -> float:
        """The chain's entropy per token, in nats: the loss of a model that knows the chain exactly."""
        p = self.transition
        pi = torch.full((p.shape[0],), 1.0 / p.shape[0], dtype=torch.float64)
        for _ in range(500):  # the stationary distribution, by power iteration
            pi = pi @ p
        return float(-(pi[:, None] * p * p.log()).sum())

    @property
    def uniform_nats(self) -> float:
        """``ln(V)``: the loss of guessing uniformly, where training starts."""
        return math.log(self.config.vocab_size)

    def batch(self, step: int, rows: int) -> torch.Tensor:
        """``rows`` sequences of ``seq + 1`` tokens for step ``step`` (inputs ``[:, :-1]``, targets ``[:, 1:]``)."""
        g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + whole_number(step, "step", 0))
        tokens = torch.empty(rows, self.config.seq + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.config.vocab_size, (rows,), generator=g)
        for t in range(self.config.seq):
            tokens[:, t + 1] = torch.multinomial(self.transition[tokens[:, t]], 1, generator=g)[:, 0]
        return tokens  # (rows, seq + 1)


def _simplex(g: torch.Generator, k: int) -> torch.Tensor:
    """``k`` positive weights summing to 1, drawn from ``g``."""
    w = -torch.rand(k, generator=g, dtype=torch.float64).log()  # exponential draws: a flat Dirichlet
    return w / w.sum()
