"""What the toy language model learns from: ``MarkovCorpus``, a seeded sparse Markov chain over the vocabulary.

Each token has a few likely successors, so a model can learn it: the loss starts near ``ln(V)`` (uniform
guessing) and falls towards the chain's entropy per token (``entropy_nats``), the least any model can reach.
Every step draws its own batch from a generator seeded by ``(seed, step)``: the reference and every rank read
the same tokens. The model and its step are ``core.training.config.TrainingConfig``. Torch only, no ranks.
"""

from __future__ import annotations

import math

import torch

from shardlib.core.checks import whole_number
from shardlib.core.training.config import TrainingConfig


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
            w = -torch.rand(k, generator=g, dtype=torch.float64).log()  # exponential draws: a flat Dirichlet
            probs[row, nxt] += (1 - noise) * w / w.sum()  # k positive weights summing to 1
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

