"""Tensor parallelism run on a pool and checked against the unsharded computation in one call.

* ``run_tp_block(ranks, part, ...)``: the MLP or the attention block on every rank of the pool, forward
  (and backward), with the largest gap from ``toy``'s reference and the collectives of each pass.
* ``run_pair(ranks, cut, ...)``: a ``d_model -> d_hidden -> d_model`` pair cut either way, its output
  against the reference and its collectives (buffer and wire bytes) against ``split.pair_collectives``
  and ``split.pair_wire_collectives``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..checks import choice
from ..models import ModelConfig, check_heads
from ..toy import attention_layer_reference, mlp_reference
from .ranks import pair_column_then_row_on_rank, pair_row_then_column_on_rank, tp_attention_on_rank, tp_mlp_on_rank
from .split import CUTS, pair_collectives, pair_wire_collectives

BLOCKS = ("mlp", "attention")


@dataclass(frozen=True)
class TPBlockRun:
    """One tensor-parallel block on a pool: its output (rank 0's: every rank ends with the whole
    output), the largest gaps from the unsharded block, and per rank the collectives of each pass."""

    part: str
    tp: int
    output: torch.Tensor
    output_gap: float  # largest |sharded - reference| over every rank's output
    grad_x_gap: float | None  # the same for the input gradient (None: forward only)
    forward_collectives: tuple[int, ...]
    backward_collectives: tuple[int, ...]
    forward_bytes: tuple[int, ...]
    backward_bytes: tuple[int, ...]
    weight_grads: tuple[dict, ...]  # per rank: its slices of the weights' gradients (empty: forward only)


def _reference(part: str, x: torch.Tensor, w: dict, model: ModelConfig) -> torch.Tensor:
    if part == "mlp":
        return mlp_reference(x, w["gate"], w["up"], w["down"])
    return attention_layer_reference(x, w["q"], w["k"], w["v"], w["o"], model.n_heads, model.n_kv_heads)


def run_tp_block(ranks, part: str, x: torch.Tensor, w: dict, model: ModelConfig,
                 grad_output: torch.Tensor | None = None) -> TPBlockRun:
    """Run ``part`` (``"mlp"`` or ``"attention"``) of one block with weights ``w`` split over every rank
    of ``ranks``, and compare it with the unsharded block on ``x`` (and, with ``grad_output``, the
    gradient of ``x``)."""
    choice(part, BLOCKS, "block part")
    if part == "attention":
        check_heads(model, ranks.world_size)
    x_ref = x.clone().requires_grad_(grad_output is not None)
    reference = _reference(part, x_ref, w, model)
    if grad_output is not None:
        reference.backward(grad_output)
    if part == "mlp":
        results = ranks.run(tp_mlp_on_rank, x, w, grad_output)
    else:
        results = ranks.run(tp_attention_on_rank, x, w, model, grad_output)
    gap = max((r["output"] - reference.detach()).abs().max().item() for r in results)
    backward = grad_output is not None
    return TPBlockRun(
        part, ranks.world_size, results[0]["output"], gap,
        max((r["grad_x"] - x_ref.grad).abs().max().item() for r in results) if backward else None,
        tuple(r["forward_collectives"] for r in results),
        tuple(r.get("backward_collectives", 0) for r in results),
        tuple(r["forward_bytes"] for r in results), tuple(r.get("backward_bytes", 0) for r in results),
        tuple(r.get("weight_grads", {}) for r in results))


@dataclass(frozen=True)
class PairRun:
    """A pair cut one way on a pool: rank 0's output, its gap from the unsharded pair, and its
    collectives as measured (rank 0's comm log: buffer bytes, and wire bytes under the ring) and as
    predicted by ``pair_collectives`` and ``pair_wire_collectives``."""

    cut: str
    tp: int
    output: torch.Tensor
    output_gap: float
    measured: tuple[tuple[str, int], ...]
    predicted: tuple[tuple[str, int], ...]
    measured_wire: tuple[tuple[str, int], ...] = ()
    predicted_wire: tuple[tuple[str, int], ...] = ()

    @property
    def measured_bytes(self) -> int:
        """Buffer bytes of rank 0's collectives."""
        return sum(size for _, size in self.measured)

    @property
    def measured_wire_bytes(self) -> int:
        """Bytes rank 0 put on the wire under the ring."""
        return sum(size for _, size in self.measured_wire)


def run_pair(ranks, cut: str, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, activation=F.gelu) -> PairRun:
    """``w2 @ activation(w1 @ x)`` cut ``cut``-wise over every rank of ``ranks``."""
    choice(cut, CUTS, "cut")
    fn = pair_column_then_row_on_rank if cut == CUTS[0] else pair_row_then_column_on_rank
    results = ranks.run(fn, x, w1, w2, activation)
    reference = F.linear(activation(F.linear(x, w1)), w2)
    gap = max((r["output"] - reference).abs().max().item() for r in results)
    tokens = x.numel() // x.shape[-1]
    shape = (cut, ranks.world_size, tokens, w1.shape[1], w1.shape[0], x.element_size())
    return PairRun(cut, ranks.world_size, results[0]["output"], gap, tuple(results[0]["collectives"]),
                   tuple(pair_collectives(*shape)), tuple(results[0]["wire"]), tuple(pair_wire_collectives(*shape)))
