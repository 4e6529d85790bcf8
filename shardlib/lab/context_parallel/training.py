"""Training through ring attention on a pool against the same steps in one process.

``train_attention_layer`` is plain SGD on ``core.model.attention_layer_reference``, in one process or, on
a rank (``ring_training_on_rank``), on its shard of the tokens with the ring as its attention, the loss
and the gradients summed over the ranks. ``run_ring_training`` sets the two side by side.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shardlib.core.checks import TOLERANCE, flag, whole_number
from shardlib.core.config import ModelConfig
from shardlib.core.context_parallel.placement import check_sequence, positions_of_rank, shard_sequence
from shardlib.core.context_parallel.ring import ring_attention
from shardlib.core.model import attention, attention_layer_reference
from shardlib.lab.harness import on_ranks


def train_attention_layer(x, target, weights: dict, model: ModelConfig, attend=None, steps: int = 5,
                          lr: float = 0.5, positions=None, count: int | None = None,
                          all_reduce=None) -> tuple[list[float], dict]:
    """Plain SGD on ``core.model.attention_layer_reference`` (``weights``: its ``q, k, v, o``; ``x, target (b,
    s, d)``; ``attend`` as it takes it), the loss the squared error against ``target`` summed over ``x``'s
    tokens over ``count`` (default: ``target``'s elements, the mean): the loss before each step and the final
    weights. On a rank holding a shard of the tokens at ``positions``, ``count`` is the whole batch's and
    ``all_reduce`` sums the loss and each gradient over the ranks."""
    total = all_reduce or (lambda t: t)
    count = target.numel() if count is None else count
    w = {name: t.detach().clone().to(x.device).requires_grad_() for name, t in weights.items()}
    losses = []
    for _ in range(steps):
        loss = ((attention_layer_reference(x, w, model, positions, attend) - target) ** 2).sum() / count
        losses.append(float(total(loss.detach().clone())))
        grads = torch.autograd.grad(loss, list(w.values()))
        with torch.no_grad():
            for t, g in zip(w.values(), grads):
                t -= lr * total(g.contiguous())
    return losses, {name: t.detach() for name, t in w.items()}


def ring_training_on_rank(ctx, x, target, weights: dict, model: ModelConfig, causal: bool = True,
                          placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> tuple[list, dict]:
    """``train_attention_layer`` through the ring on this rank's tokens of ``x, target (b, s, d)``, at their
    places in the sequence: its loss is its share of the whole batch's, and the loss and the gradients are
    summed over the ranks."""
    n, seq = ctx.world_size, x.shape[1]
    x, target = (shard_sequence(t, n, placement, dim=1)[ctx.rank].to(ctx.device) for t in (x, target))
    positions = torch.tensor(positions_of_rank(ctx.rank, n, seq, placement), device=ctx.device)  # (s / n,)
    return train_attention_layer(x, target, weights, model,
                                 lambda q, k, v: ring_attention(ctx, q, k, v, causal, placement), steps, lr,
                                 positions, count=target.numel() * n, all_reduce=ctx.comm.all_reduce)


@dataclass(frozen=True)
class RingTraining:
    """SGD through ring attention on a pool against the same steps in one process."""

    losses: tuple[float, ...]
    reference_losses: tuple[float, ...]
    weight_gap: float

    @property
    def exact(self) -> bool:
        return self.weight_gap <= TOLERANCE and all(abs(a - b) <= TOLERANCE * max(1.0, abs(b))
                                                    for a, b in zip(self.losses, self.reference_losses))

    @property
    def loss_fell(self) -> bool:
        return self.losses[-1] < self.losses[0]


def run_ring_training(ranks, x, target, weights: dict, model: ModelConfig, causal: bool = True,
                      placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> RingTraining:
    """``steps`` of SGD on ``core.model.attention_layer_reference`` with ``weights`` (``q, k, v, o`` of
    ``model``'s shape; ``x, target (b, s, d)``) through the ring, each rank holding its tokens, and in one
    process with whole-sequence attention."""
    check_sequence(x.shape[1], ranks.world_size, placement)
    steps = whole_number(steps, "steps")
    got = on_ranks(ranks, ring_training_on_rank, x, target, weights, model, flag(causal, "causal"), placement,
                   steps, lr)
    losses, trained = got.first()  # every rank holds the same losses and weights
    whole = None if causal else (lambda q, k, v: attention(q, k, v, causal=False))
    reference_losses, final = train_attention_layer(x, target, weights, model, whole, steps, lr)
    gap = max(float((trained[name] - final[name]).abs().max()) for name in final)
    return RingTraining(tuple(losses), tuple(reference_losses), gap)
