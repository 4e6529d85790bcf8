"""Megatron sequence parallelism run on a pool, beside tensor parallelism alone and the unsharded block.

``run_sequence_parallel`` runs one toy block forward and backward twice on the same ranks (tensor
parallel alone, then with sequence parallelism), and sets each against the unsharded block
(``toy.block_reference``): output, input gradient and every weight gradient, the wire bytes of each
pass read from the comm log against ``predict.sequence_parallel_bytes_per_rank``, and the activations
autograd kept, measured on each rank against ``memory.toy_block_activation_bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import same_dtype
from ..context_parallel.memory import toy_block_activation_bytes
from ..context_parallel.predict import sequence_parallel_bytes_per_rank
from ..models import ModelConfig
from ..runtime.measure import TOLERANCE
from ..toy import block_reference
from .sequence_parallel import SEQ_DIM, check_sequence_parallel, sp_block_on_rank

ROW_PARALLEL = ("o", "down")  # cut along their inputs (dim 1); the others along their outputs (dim 0)


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


def _reference(x, w, model, grad_output):
    x_ref = x.clone().requires_grad_(True)
    w_ref = {k: t.clone().requires_grad_(True) for k, t in w.items()}
    out = block_reference(x_ref, w_ref, model)
    out.backward(grad_output)
    return out.detach(), x_ref.grad, {k: t.grad for k, t in w_ref.items()}


def _mode(name, per_rank, reference, tp, model, x, sp: bool) -> BlockMode:
    out_ref, grad_x_ref, grads_ref = reference
    join = (lambda key: torch.cat([r[key] for r in per_rank], dim=SEQ_DIM)) if sp else (lambda key: per_rank[0][key])
    pairs = [(g, grads_ref[k].chunk(tp, dim=1 if k in ROW_PARALLEL else 0)[r])
             for r, res in enumerate(per_rank) for k, g in res["weight_grads"].items()]
    first = per_rank[0]
    b, s, d = x.shape
    return BlockMode(
        name, float((join("output") - out_ref).abs().max()), float((join("grad_x") - grad_x_ref).abs().max()),
        max(float((a - b).abs().max()) for a, b in pairs),
        len(pairs) == 7 * tp and all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs),
        tuple(op for op, _, _ in first["forward"]), tuple(op for op, _, _ in first["backward"]),
        sum(wire for _, _, wire in first["forward"]), sum(wire for _, _, wire in first["backward"]),
        tuple(r["activation_bytes"] for r in per_rank),
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
    reference = _reference(x, w, model, grad_output)
    modes = {}
    for sp in (False, True):
        per_rank = ranks.run(sp_block_on_rank, x, w, model, grad_output, sp)
        modes[sp] = _mode("sequence parallel" if sp else "tensor parallel", per_rank, reference, tp, model, x, sp)
    return SequenceParallelRun(tp, modes[False], modes[True])
