"""Tensor and sequence parallelism on a pool, against the unsharded computation, and in one process.

Rank functions: ``tp_block_on_rank`` (the MLP, attention, or the whole block, tensor parallel alone or
sequence parallel, forward and backward, each pass a span ``forward``/``backward`` so its collectives can
be told apart) and a pair cut either way (``PAIRS``). On a pool: ``run_tp_block``, ``run_pair`` (its
collectives against ``predict``'s) and ``run_sequence_parallel`` (gaps, wire bytes and activation bytes
against their formulas). ``pair_in_one_process`` and ``tp_stack_in_one_process`` run every rank's share of
``core``'s layers here and sum the shares (a stand-in for the all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shardlib.core.checks import TOLERANCE, choice, same_dtype
from shardlib.core.config import ModelConfig, check_heads
from shardlib.core.model import attention_layer_reference, block_reference, mlp_reference, norm
from shardlib.core.tensor_parallel.blocks import ParallelAttention, ParallelBlock, ParallelMLP
from shardlib.core.tensor_parallel.layers import (
    ROW_PARALLEL,
    ColumnParallelLinear,
    RowParallelLinear,
    TPGroup,
    shard_columns,
    shard_rows,
)
from shardlib.core.tensor_parallel.sequence_parallel import SEQ_DIM, check_sequence_parallel
from shardlib.lab.harness import Measured, on_ranks
from shardlib.lab.measure import SavedBytes
from shardlib.predict.shapes import check_tensor_parallel
from shardlib.predict.tensor_parallel import (
    CUTS,
    pair_collectives,
    pair_wire_collectives,
    sequence_parallel_bytes_per_rank,
    toy_block_activation_bytes,
)

BLOCKS = ("mlp", "attention")


BLOCK_MODULES = {  # part -> its core module on one rank
    "mlp": lambda w, model, tpg: ParallelMLP(w, tpg),
    "attention": ParallelAttention,
    "tensor parallel": ParallelBlock,
    "sequence parallel": lambda w, model, tpg: ParallelBlock(w, model, tpg, sequence_parallel=True),
}


def tp_block_on_rank(ctx, part: str, x: torch.Tensor, w: dict, model=None,
                     grad_output: torch.Tensor | None = None) -> dict:
    """``part`` (a key of ``BLOCK_MODULES``) of one block of ``model`` with weights ``w``, split over every
    rank, forward and (with ``grad_output``) backward, on whole ``(b, s, d)`` tensors (sequence parallel:
    this rank's run of tokens). Returns ``output``, ``grad_x``, ``weight_grads`` (this rank's slices, by
    weight name) and ``activation_bytes`` (what autograd saved in the forward)."""
    tp, r = ctx.world_size, ctx.rank
    if part == "sequence parallel":
        check_sequence_parallel(model, x.shape[SEQ_DIM], tp)
    block = BLOCK_MODULES[part](w, model, TPGroup.world(ctx)).to(ctx.device)
    cut = (lambda t: t.chunk(tp, dim=SEQ_DIM)[r]) if part == "sequence parallel" else (lambda t: t)
    h = cut(x).to(ctx.device).clone().requires_grad_(grad_output is not None)  # (b, s or s / tp, d)
    with ctx.timeline.span("forward"), SavedBytes({p.data_ptr() for p in block.parameters()}) as saved:
        out = block(h)
    if grad_output is not None:
        with ctx.timeline.span("backward"):
            out.backward(cut(grad_output).to(ctx.device))
    grads = {name.rpartition(".")[2]: m.weight.grad for name, m in block.named_modules()
             if isinstance(m, (ColumnParallelLinear, RowParallelLinear)) and m.weight.grad is not None}
    return {"output": out.detach(), "grad_x": h.grad, "weight_grads": grads, "activation_bytes": saved.size_bytes}


def pair_column_then_row_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The right cut of ``w2 @ gelu(w1 @ x)``: ``w1`` by columns, ``w2`` by rows. One all-reduce of the output."""
    tp, r = ctx.world_size, ctx.rank
    hidden = F.gelu(F.linear(x, shard_columns(w1, tp)[r]))  # (b, s, d_ff / tp): no communication
    return ctx.comm.all_reduce(F.linear(hidden, shard_rows(w2, tp)[r]))  # (b, s, d_model): sum of partials


def pair_row_then_column_on_rank(ctx, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """The other cut: ``w1`` by rows, ``w2`` by columns. The gelu is not linear, so the partial first
    product is summed *before* it (an all-reduce of the wide intermediate); the output slices are gathered."""
    tp, r = ctx.world_size, ctx.rank
    x_slice = x.chunk(tp, dim=-1)[r]  # (b, s, d_model / tp): this rank's input features
    hidden = ctx.comm.all_reduce(F.linear(x_slice, shard_rows(w1, tp)[r]))  # (b, s, d_ff): partial -> summed
    out_slice = F.linear(F.gelu(hidden), shard_columns(w2, tp)[r])  # (b, s, d_model / tp)
    return ctx.comm.all_gather(out_slice, dim=-1)  # (b, s, d_model)


PAIRS = {CUTS[0]: pair_column_then_row_on_rank, CUTS[1]: pair_row_then_column_on_rank}  # cut -> rank function


def pair_in_one_process(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, tp: int, b1: torch.Tensor | None = None,
                        b2: torch.Tensor | None = None, activation=None) -> torch.Tensor:
    """``w2 @ activation(w1 @ x + b1) + b2`` as ``tp`` column-then-row shares, summed here. Share ``i`` holds
    column slice ``i`` of ``w1`` and ``b1``, row slice ``i`` of ``w2``, and needs nothing from any other.
    ``activation`` must be elementwise: it then acts on each slice as on the whole. ``b2`` is added once,
    after the sum, or it would be counted ``tp`` times."""
    if w1.shape[0] != w2.shape[1]:
        raise ValueError(f"the pair does not chain: w1 produces {w1.shape[0]} features but w2 expects {w2.shape[1]}")
    act = activation or (lambda t: t)
    columns = [ColumnParallelLinear(w1, b1, TPGroup(tp, i)) for i in range(tp)]  # (d_hidden / tp, d_in) each
    rows = [RowParallelLinear(w2, None, TPGroup(tp, i)) for i in range(tp)]  # (d_out, d_hidden / tp) each
    shares = [row.partial(act(column.local(x))) for column, row in zip(columns, rows)]  # no communication
    total = torch.stack(shares).sum(0)  # (..., d_out): the all-reduce
    return total if b2 is None else total + b2


@torch.no_grad()
def tp_stack_in_one_process(x: torch.Tensor, layers: list[dict], model: ModelConfig, tp: int) -> torch.Tensor:
    """``model.stack_reference`` from the blocks the ranks run: every rank's ``ParallelBlock`` share of each
    attention and MLP (its heads, its ``d_ff / tp`` features) computed here and summed. Equal to the stack
    within float32 rounding: the partials add in another order."""
    check_tensor_parallel(model, tp)
    h = x
    for w in layers:
        blocks = [ParallelBlock(w, model, TPGroup(tp, r)) for r in range(tp)]
        if "q" in w:
            h = h + sum(b.attention.local(norm(h, w.get("attn_norm"), model)) for b in blocks)
        if "gate" in w:
            h = h + sum(b.mlp.local(norm(h, w.get("mlp_norm"), model)) for b in blocks)
    return h


def _reference(part: str, x: torch.Tensor, w: dict, model: ModelConfig, grad_output) -> tuple:
    """The unsharded ``part``: its output, and with ``grad_output`` the gradients of ``x`` and of each weight."""
    x = x.clone().requires_grad_(grad_output is not None)
    w = {k: t.clone().requires_grad_(grad_output is not None) for k, t in w.items()}
    if part == "mlp":
        out = mlp_reference(x, w["gate"], w["up"], w["down"])
    elif part == "attention":
        out = attention_layer_reference(x, w, model)
    else:
        out = block_reference(x, w, model)
    if grad_output is not None:
        out.backward(grad_output)
    return out.detach(), x.grad, {k: t.grad for k, t in w.items() if t.grad is not None}


@dataclass(frozen=True)
class BlockRun:
    """One block on a pool against the unsharded one (``reference``: output, input gradient, weight
    gradients). The weight gradients, summed over every token, are checked with ``rtol = atol = TOLERANCE``."""

    name: str  # "mlp", "attention", "tensor parallel" or "sequence parallel"
    got: Measured
    reference: tuple
    model: ModelConfig
    x: torch.Tensor  # (b, s, d_model), the whole input

    tp = property(lambda self: len(self.got))
    sequence_parallel = property(lambda self: self.name == "sequence parallel")

    def _gap(self, key: str, reference: torch.Tensor | None) -> float | None:
        """Largest |sharded - reference| over every rank's ``key`` (sequence parallel: the shards joined)."""
        if reference is None:
            return None
        if self.sequence_parallel:
            return float((self.got.cat(key, dim=SEQ_DIM) - reference).abs().max())
        return self.got.max_gap(key, reference)

    output_gap = property(lambda self: self._gap("output", self.reference[0]))
    grad_x_gap = property(lambda self: self._gap("grad_x", self.reference[1]))  # None: forward only
    weight_grads = property(lambda self: self.got.each("weight_grads"))  # per rank: its slices, by weight name

    def _weight_pairs(self) -> list:
        """(rank r's slice, the same slice of the reference gradient), every weight of every rank."""
        return [(g, self.reference[2][k].chunk(self.tp, dim=1 if k in ROW_PARALLEL else 0)[r])
                for r, grads in enumerate(self.weight_grads) for k, g in grads.items()]

    weight_grad_gap = property(lambda self: max((float((a - b).abs().max()) for a, b in self._weight_pairs()),
                                                default=0.0))

    @property
    def weight_grads_close(self) -> bool:
        pairs = self._weight_pairs()
        return (len(pairs) == len(self.reference[2]) * self.tp
                and all(torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE) for a, b in pairs))

    @property
    def exact(self) -> bool:
        return max(self.output_gap, self.grad_x_gap or 0.0) <= TOLERANCE and self.weight_grads_close

    def _pass(self, name: str, rank: int) -> tuple:
        """The comm records ``rank`` issued inside its ``name`` span (``forward`` or ``backward``)."""
        return tuple(r for s in self.got.spans(name, rank) for r in self.got.within(s))

    def _per_rank(self, name: str, read) -> tuple:
        return tuple(read(self._pass(name, rank)) for rank in self.got.ranks)

    forward_collectives = property(lambda self: self._per_rank("forward", len))
    backward_collectives = property(lambda self: self._per_rank("backward", len))
    forward_bytes = property(lambda self: self._per_rank("forward", lambda rs: sum(r.size_bytes for r in rs)))
    backward_bytes = property(lambda self: self._per_rank("backward", lambda rs: sum(r.size_bytes for r in rs)))
    forward_ops = property(lambda self: tuple(r.op for r in self._pass("forward", 0)))  # rank 0's
    backward_ops = property(lambda self: tuple(r.op for r in self._pass("backward", 0)))
    forward_wire_bytes = property(lambda self: sum(r.wire_bytes for r in self._pass("forward", 0)))  # per rank
    backward_wire_bytes = property(lambda self: sum(r.wire_bytes for r in self._pass("backward", 0)))
    activation_bytes = property(lambda self: self.got.each("activation_bytes"))  # per rank, autograd's

    @property
    def predicted_activation_bytes(self) -> float:
        b, s, _ = self.x.shape
        return toy_block_activation_bytes(self.model, b, s, self.tp, self.sequence_parallel, self.x.element_size())

    @property
    def predicted_wire_bytes(self) -> float:  # per rank per pass
        b, s, d = self.x.shape
        return sequence_parallel_bytes_per_rank(b, s, d, self.tp, 2, self.x.element_size())[self.name]


def _run_block(ranks, part: str, x: torch.Tensor, w: dict, model: ModelConfig, grad_output) -> BlockRun:
    got = on_ranks(ranks, tp_block_on_rank, part, x, w, model, grad_output)
    return BlockRun(part, got, _reference(part, x, w, model, grad_output), model, x)


def run_tp_block(ranks, part: str, x: torch.Tensor, w: dict, model: ModelConfig,
                 grad_output: torch.Tensor | None = None) -> BlockRun:
    """Run ``part`` (``"mlp"`` or ``"attention"``) of one block with weights ``w`` split over every rank
    of ``ranks``, and compare it with the unsharded block on ``x`` (and, with ``grad_output``, the
    gradients of ``x`` and of the weights)."""
    choice(part, BLOCKS, "block part")
    if part == "attention":
        check_heads(model, ranks.world_size)
    return _run_block(ranks, part, x, w, model, grad_output)


@dataclass(frozen=True)
class SequenceParallelRun:
    """The same block, tensor parallel alone and sequence parallel, on the same ranks."""

    tensor_parallel: BlockRun
    sequence_parallel: BlockRun

    @property
    def activation_saving(self) -> float:
        """Sequence parallel's activation bytes per rank over tensor parallel's (below 1: smaller)."""
        return max(self.sequence_parallel.activation_bytes) / max(self.tensor_parallel.activation_bytes)


def run_sequence_parallel(ranks, x: torch.Tensor, w: dict, model: ModelConfig,
                          grad_output: torch.Tensor) -> SequenceParallelRun:
    """One block of ``model`` with weights ``w`` (attention and MLP) on ``x (b, s, d_model)``, forward and
    backward (``grad_output`` fed to the output), tensor parallel alone and sequence parallel, on every
    rank of ``ranks``."""
    if x.dim() != 3 or x.shape[-1] != model.d_model:
        raise ValueError(f"x must be (batch, seq, d_model = {model.d_model}), got shape {tuple(x.shape)}")
    if tuple(grad_output.shape) != tuple(x.shape):
        raise ValueError(f"grad_output must have x's shape {tuple(x.shape)}, got {tuple(grad_output.shape)}")
    if not ("q" in w and "gate" in w):
        raise ValueError(f"w must hold a whole block (q, k, v, o, gate, up, down), got {sorted(w)}")
    same_dtype(x.dtype, w["q"].dtype, "x")
    check_sequence_parallel(model, x.shape[SEQ_DIM], ranks.world_size)
    return SequenceParallelRun(*(_run_block(ranks, part, x, w, model, grad_output)
                                 for part in ("tensor parallel", "sequence parallel")))


@dataclass(frozen=True)
class PairRun:
    """A pair cut one way on a pool (``got``: every rank's output and comm log) against the unsharded
    pair, and its collectives as ``pair_collectives`` and ``pair_wire_collectives`` predict them."""

    cut: str
    got: Measured
    reference: torch.Tensor  # (b, s, d_model)
    predicted: tuple[tuple[str, int], ...]
    predicted_wire: tuple[tuple[str, int], ...]

    output_gap = property(lambda self: self.got.max_gap(None, self.reference))  # over every rank's output
    # rank 0's collectives from its comm log: (op, buffer bytes), and (op, wire bytes) under the ring
    measured = property(lambda self: tuple((r.op, r.size_bytes) for r in self.got.records(rank=0)))
    measured_wire = property(lambda self: tuple((r.op, r.wire_bytes) for r in self.got.records(rank=0)))
    measured_bytes = property(lambda self: self.got.bytes(rank=0))
    measured_wire_bytes = property(lambda self: self.got.bytes(rank=0, wire=True))


def run_pair(ranks, cut: str, x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> PairRun:
    """``w2 @ gelu(w1 @ x)`` cut ``cut``-wise over every rank of ``ranks``."""
    choice(cut, CUTS, "cut")
    shape = (cut, ranks.world_size, x.numel() // x.shape[-1], w1.shape[1], w1.shape[0], x.element_size())
    return PairRun(cut, on_ranks(ranks, PAIRS[cut], x, w1, w2), F.linear(F.gelu(F.linear(x, w1)), w2),
                   tuple(pair_collectives(*shape)), tuple(pair_wire_collectives(*shape)))
