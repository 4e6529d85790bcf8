"""Context parallelism's backward run on a pool: gradients against autograd, and training through the ring.

``run_ring_attention_grads`` and ``run_ulysses_attention_grads``: every rank's dQ, dK, dV shards against
autograd through ``scaled_dot_product_attention`` on the whole sequence, and the backward's wire bytes
against ``predict``. ``run_ring_training``: SGD on a tiny attention layer through ring attention,
against the same steps in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from shardlib.core.checks import TOLERANCE, flag, whole_number
from shardlib.core.context_parallel.online_softmax import attention_reference
from shardlib.core.context_parallel.placement import check_sequence
from shardlib.core.context_parallel.ring import check_ring_inputs
from shardlib.core.context_parallel.ulysses import check_ulysses_inputs
from shardlib.lab.context_parallel.drivers import attention_shape
from shardlib.lab.context_parallel.ranks import ring_attention_on_rank, ring_training_on_rank, ulysses_attention_on_rank
from shardlib.lab.context_parallel.reference import attention_grads_reference, shard_sequence, train_attention_layer
from shardlib.lab.harness import Measured, on_ranks
from shardlib.predict.context_parallel import ring_backward_bytes_per_rank, ulysses_collectives


@dataclass(frozen=True)
class AttentionGrads:
    """Forward and backward of an attention method on a pool: each rank's ``(dq, dk, dv)`` shards against
    autograd through the whole-sequence attention cut the same way (``gaps[rank]``), rank 0's wire bytes
    per pass, and the bytes each rank's forward saved for its backward."""

    got: Measured = field(repr=False)
    reference: tuple[tuple[torch.Tensor, ...], ...] = field(repr=False)
    predicted_backward_bytes: float

    saved_bytes = property(lambda self: self.got.each("saved_bytes"))

    @property
    def shards(self) -> tuple[tuple[torch.Tensor, ...], ...]:
        return tuple(zip(*(self.got.each(name) for name in ("dq", "dk", "dv"))))

    @property
    def gaps(self) -> tuple[tuple[float, ...], ...]:
        return tuple(tuple(float((a - b).abs().max()) for a, b in zip(mine, want))
                     for mine, want in zip(self.shards, self.reference))

    def _sent(self, part: str) -> int:
        """Rank 0's wire bytes in the ``part`` span (``forward`` or ``backward``)."""
        (span,) = self.got.spans(part, rank=0)
        return sum(c.wire_bytes for c in self.got.within(span))

    forward_bytes = property(lambda self: self._sent("forward"))
    backward_bytes = property(lambda self: self._sent("backward"))

    @property
    def exact(self) -> bool:
        """Every rank's every gradient within ``TOLERANCE`` (``rtol = atol``) of the reference's."""
        return all(torch.allclose(mine, ref, rtol=TOLERANCE, atol=TOLERANCE)
                   for got, want in zip(self.shards, self.reference) for mine, ref in zip(got, want))


def _grads(got: Measured, q, k, v, d_out, causal: bool, placement: str, scale, predicted) -> AttentionGrads:
    whole = attention_grads_reference(q, k, v, d_out, causal, scale)
    return AttentionGrads(got, tuple(zip(*(shard_sequence(t, len(got.times_s), placement) for t in whole))), predicted)


def run_ring_attention_grads(ranks, q, k, v, d_out, causal: bool = True, placement: str = "contiguous",
                             overlap: bool = True, scale: float | None = None) -> AttentionGrads:
    """``ring.ring_attention`` forward and backward on every rank, ``d_out`` the upstream gradient of
    the whole output (shaped like ``q``)."""
    check_ring_inputs(q.shape, k.shape, v.shape, ranks.world_size, placement, local=False)
    got = on_ranks(ranks, ring_attention_on_rank, q, k, v, flag(causal, "causal"), placement,
                   flag(overlap, "overlap"), scale, d_out=d_out)
    predicted = ring_backward_bytes_per_rank(attention_shape(q, k), ranks.world_size)
    return _grads(got, q, k, v, d_out, causal, placement, scale, predicted)


def run_ulysses_attention_grads(ranks, q, k, v, d_out, causal: bool = True,
                                scale: float | None = None) -> AttentionGrads:
    """``ulysses.ulysses_attention`` forward and backward on every rank (contiguous shards): the
    backward runs the four all-to-alls again, each the transpose of its forward."""
    check_ulysses_inputs(q.shape, k.shape, v.shape, ranks.world_size, local=False)
    got = on_ranks(ranks, ulysses_attention_on_rank, q, k, v, flag(causal, "causal"), scale, d_out=d_out)
    predicted = sum(wire for _, _, wire in ulysses_collectives(attention_shape(q, k), ranks.world_size))
    return _grads(got, q, k, v, d_out, causal, "contiguous", scale, predicted)


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


def run_ring_training(ranks, x, target, weights: dict, head_dim: int, causal: bool = True,
                      placement: str = "contiguous", steps: int = 5, lr: float = 0.5) -> RingTraining:
    """``steps`` of SGD on ``reference.attention_layer`` (``x, target (b, s, d)``) through the ring, each
    rank holding its tokens, and in one process with whole-sequence attention."""
    check_sequence(x.shape[1], ranks.world_size, placement)
    steps = whole_number(steps, "steps")
    got = on_ranks(ranks, ring_training_on_rank, x, target, weights, head_dim, flag(causal, "causal"), placement,
                   steps, lr)
    losses, trained = got.first()  # every rank holds the same losses and weights
    reference_losses, final = train_attention_layer(x, target, weights, head_dim,
                                                    lambda q, k, v: attention_reference(q, k, v, causal), steps, lr)
    gap = max(float((trained[name] - final[name]).abs().max()) for name in final)
    return RingTraining(tuple(losses), tuple(reference_losses), gap)
