"""Tensor and sequence parallelism run on a pool, against the unsharded computation, in one call each.

``run_tp_block`` (the MLP or attention, forward and backward), ``run_pair`` (a pair cut either way, its
collectives against ``predict``'s) and ``run_sequence_parallel`` (one block tensor parallel alone and with
sequence parallelism: gaps, wire bytes and the activation bytes autograd kept, against their formulas).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlib.core.checks import TOLERANCE, choice, same_dtype
from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.tensor_parallel.layers import ROW_PARALLEL
from shardlib.core.tensor_parallel.sequence_parallel import SEQ_DIM, check_sequence_parallel
from shardlib.core.toy import attention_layer_reference, block_reference, mlp_reference
from shardlib.lab.harness import on_ranks
from shardlib.lab.tensor_parallel.ranks import (
    pair_column_then_row_on_rank,
    pair_row_then_column_on_rank,
    sp_block_on_rank,
    tp_attention_on_rank,
    tp_mlp_on_rank,
)
from shardlib.predict.context_parallel import sequence_parallel_bytes_per_rank
from shardlib.predict.context_parallel_memory import toy_block_activation_bytes
from shardlib.predict.tensor_parallel import CUTS, pair_collectives, pair_wire_collectives

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
        got = on_ranks(ranks, tp_mlp_on_rank, x, w, grad_output)
    else:
        got = on_ranks(ranks, tp_attention_on_rank, x, w, model, grad_output)
    return TPBlockRun(
        part, ranks.world_size, got.first("output"), got.max_gap("output", reference.detach()),
        got.max_gap("grad_x", x_ref.grad) if grad_output is not None else None,
        got.each("forward_collectives"), got.each("backward_collectives"),
        got.each("forward_bytes"), got.each("backward_bytes"), got.each("weight_grads"))


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
    got = on_ranks(ranks, fn, x, w1, w2, activation)
    reference = F.linear(activation(F.linear(x, w1)), w2)
    tokens = x.numel() // x.shape[-1]
    shape = (cut, ranks.world_size, tokens, w1.shape[1], w1.shape[0], x.element_size())
    return PairRun(cut, ranks.world_size, got.first("output"), got.max_gap("output", reference),
                   got.first("collectives"), tuple(pair_collectives(*shape)), got.first("wire"),
                   tuple(pair_wire_collectives(*shape)))


@dataclass(frozen=True)
class BlockMode:
    """One way of running the block on the pool: its largest gaps from the unsharded block (the weight
    gradients, summed over every token, are larger numbers: ``weight_grads_close`` checks them with
    ``rtol = atol = TOLERANCE``), what each pass sent (per rank, wire bytes), and the activation bytes
    each rank kept, with the formula's."""

    name: str
    output_gap: float
    grad_x_gap: float
    weight_grad_gap: float
    weight_grads_close: bool
    forward_ops: tuple[str, ...]
    backward_ops: tuple[str, ...]
    forward_wire_bytes: int
    backward_wire_bytes: int
    activation_bytes: tuple[int, ...]
    predicted_activation_bytes: float
    predicted_wire_bytes: float  # per pass

    @property
    def exact(self) -> bool:
        return max(self.output_gap, self.grad_x_gap) <= TOLERANCE and self.weight_grads_close


@dataclass(frozen=True)
class SequenceParallelRun:
    """The same block, tensor parallel alone and sequence parallel, on ``tp`` ranks."""

    tp: int
    tensor_parallel: BlockMode
    sequence_parallel: BlockMode

    @property
    def activation_saving(self) -> float:
        """Sequence parallel's activation bytes per rank over tensor parallel's (below 1: smaller)."""
        return max(self.sequence_parallel.activation_bytes) / max(self.tensor_parallel.activation_bytes)


def _block_reference(x, w, model, grad_output):
    x_ref = x.clone().requires_grad_(True)
    w_ref = {k: t.clone().requires_grad_(True) for k, t in w.items()}
    out = block_reference(x_ref, w_ref, model)
    out.backward(grad_output)
    return out.detach(), x_ref.grad, {k: t.grad for k, t in w_ref.items()}


def _mode(name, per_rank, reference, tp, model, x, sp: bool) -> BlockMode:
    out_ref, grad_x_ref, grads_ref = reference
    join = (lambda key: per_rank.cat(key, dim=SEQ_DIM)) if sp else per_rank.first
    pairs = [(g, grads_ref[k].chunk(tp, dim=1 if k in ROW_PARALLEL else 0)[r])
             for r, grads in enumerate(per_rank.each("weight_grads")) for k, g in grads.items()]
    forward, backward = per_rank.first("forward"), per_rank.first("backward")
    b, s, d = x.shape
    return BlockMode(
        name, float((join("output") - out_ref).abs().max()), float((join("grad_x") - grad_x_ref).abs().max()),
        max(float((a - b).abs().max()) for a, b in pairs),
        len(pairs) == 7 * tp and all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs),
        tuple(op for op, _, _ in forward), tuple(op for op, _, _ in backward),
        sum(wire for _, _, wire in forward), sum(wire for _, _, wire in backward),
        per_rank.each("activation_bytes"),
        toy_block_activation_bytes(model, b, s, tp, sp, x.element_size()),
        sequence_parallel_bytes_per_rank(b, s, d, tp, 2, x.element_size())[
            "sequence parallel" if sp else "tensor parallel"])


def run_sequence_parallel(ranks, x: torch.Tensor, w: dict, model: ModelConfig,
                          grad_output: torch.Tensor) -> SequenceParallelRun:
    """One block of ``model`` with weights ``w`` (attention and MLP) on ``x (b, s, d_model)``, forward and
    backward (``grad_output`` fed to the output), tensor parallel alone and sequence parallel, on every
    rank of ``ranks``."""
    tp = ranks.world_size
    if x.dim() != 3 or x.shape[-1] != model.d_model:
        raise ValueError(f"x must be (batch, seq, d_model = {model.d_model}), got shape {tuple(x.shape)}")
    if tuple(grad_output.shape) != tuple(x.shape):
        raise ValueError(f"grad_output must have x's shape {tuple(x.shape)}, got {tuple(grad_output.shape)}")
    if not ("q" in w and "gate" in w):
        raise ValueError(f"w must hold a whole block (q, k, v, o, gate, up, down), got {sorted(w)}")
    same_dtype(x.dtype, w["q"].dtype, "x")
    check_sequence_parallel(model, x.shape[SEQ_DIM], tp)
    reference = _block_reference(x, w, model, grad_output)
    modes = {}
    for sp in (False, True):
        per_rank = on_ranks(ranks, sp_block_on_rank, x, w, model, grad_output, sp)
        modes[sp] = _mode("sequence parallel" if sp else "tensor parallel", per_rank, reference, tp, model, x, sp)
    return SequenceParallelRun(tp, modes[False], modes[True])
