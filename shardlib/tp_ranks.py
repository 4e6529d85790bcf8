"""Tensor parallelism on real ranks: Megatron-LM's f and g, parallel linear layers, MLP and attention.

Megatron-LM (Shoeybi et al. 2019, section 3) writes the communication of a column-then-row pair as two
conjugate operators:

* ``f`` (``CopyToParallelRegion``): identity in the forward pass, all-reduce of the gradient in the
  backward pass. It sits where the replicated input enters the column-parallel matrix: each rank's
  slice contributes a partial gradient for the whole input.
* ``g`` (``ReduceFromParallelRegion``): all-reduce in the forward pass, identity backward. It sits after
  the row-parallel matrix, summing the partial outputs.

So a pair costs one all-reduce forward and one backward. Every collective goes through ``ctx.comm``, so
the counts and bytes are read from the comm log, not asserted by hand. Each rank here receives the full
weights and keeps only its slice; a real deployment loads only the slice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .tensor_parallel import shard_columns, shard_rows


class CopyToParallelRegion(torch.autograd.Function):
    """Megatron's f: forward identity, backward all-reduce (sum of every rank's input gradient)."""

    @staticmethod
    def forward(fctx, x, comm):
        fctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(fctx, grad):
        return fctx.comm.all_reduce(grad.contiguous().clone()), None


class ReduceFromParallelRegion(torch.autograd.Function):
    """Megatron's g: forward all-reduce (sum of the partial outputs), backward identity."""

    @staticmethod
    def forward(fctx, x, comm):
        return comm.all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(fctx, grad):
        return grad, None


class ColumnParallelLinear(nn.Module):
    """Holds one column slice of a weight: whole input in (through f), a slice of the features out."""

    def __init__(self, weight_shard: torch.Tensor, bias_shard: torch.Tensor | None, comm) -> None:
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(weight_shard.detach().clone())  # (out / tp, in)
        self.bias = None if bias_shard is None else nn.Parameter(bias_shard.detach().clone())

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None, ctx) -> "ColumnParallelLinear":
        bias_shard = None if bias is None else shard_columns(bias, ctx.world_size)[ctx.rank]
        return cls(shard_columns(weight, ctx.world_size)[ctx.rank], bias_shard, ctx.comm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToParallelRegion.apply(x, self.comm)  # (..., in), replicated
        return F.linear(x, self.weight, self.bias)  # (..., out / tp)


class RowParallelLinear(nn.Module):
    """Holds one row slice of a weight: a slice of the features in, the full output out (through g)."""

    def __init__(self, weight_shard: torch.Tensor, bias: torch.Tensor | None, comm) -> None:
        super().__init__()
        self.comm = comm
        self.weight = nn.Parameter(weight_shard.detach().clone())  # (out, in / tp)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone())  # (out,), whole

    @classmethod
    def from_full(cls, weight: torch.Tensor, bias: torch.Tensor | None, ctx) -> "RowParallelLinear":
        return cls(shard_rows(weight, ctx.world_size)[ctx.rank], bias, ctx.comm)

    def forward(self, x_shard: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x_shard, self.weight)  # (..., out), this rank's share of the sum
        out = ReduceFromParallelRegion.apply(partial, self.comm)
        return out if self.bias is None else out + self.bias  # the bias once, after the sum


# -- references: the unsharded computations -----------------------------------------------------------
def mlp_reference(x, w_gate, w_up, w_down):
    """The gated MLP of Llama and Mixtral experts: ``down(silu(gate(x)) * up(x))``."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def attention_reference(x, wq, wk, wv, wo, n_heads: int, n_kv_heads: int):
    """Causal grouped-query attention: ``n_heads`` query heads share ``n_kv_heads`` KV heads."""
    batch, seq, _ = x.shape
    head_dim = wq.shape[0] // n_heads
    q = F.linear(x, wq).view(batch, seq, n_heads, head_dim).transpose(1, 2)  # (b, heads, s, hd)
    k = F.linear(x, wk).view(batch, seq, n_kv_heads, head_dim).transpose(1, 2)  # (b, kv_heads, s, hd)
    v = F.linear(x, wv).view(batch, seq, n_kv_heads, head_dim).transpose(1, 2)
    group = n_heads // n_kv_heads  # query heads per KV head
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads, s, hd)
    return F.linear(o.transpose(1, 2).reshape(batch, seq, n_heads * head_dim), wo)


def check_heads(n_heads: int, n_kv_heads: int, tp: int) -> None:
    """Tensor parallelism gives each device whole query heads and the whole KV heads they read."""
    if n_kv_heads % tp:
        raise ValueError(f"{n_kv_heads} KV heads cannot be split {tp} ways: tensor parallelism gives each "
                         "device whole KV heads")
    if n_heads % tp:
        raise ValueError(f"{n_heads} query heads cannot be split {tp} ways: each device needs whole heads")


def toy_block_weights(seed: int, d: int = 32, d_ff: int = 64, heads: int = 8, kv: int = 4, head_dim: int = 4) -> dict:
    """Reproducible weights for one MLP and one attention block (scaled by 1/sqrt(fan_in)), with an input
    ``x`` of shape (2, 6, d) and an output gradient ``grad`` of the same shape."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) / shape[-1] ** 0.5

    return {"x": torch.randn(2, 6, d, generator=g), "grad": torch.randn(2, 6, d, generator=g),
            "gate": r(d_ff, d), "up": r(d_ff, d), "down": r(d, d_ff),
            "q": r(heads * head_dim, d), "k": r(kv * head_dim, d), "v": r(kv * head_dim, d), "o": r(d, heads * head_dim)}


# -- rank functions ------------------------------------------------------------------------------------
def _run(ctx, block, x, grad_output):
    """Forward (and backward when ``grad_output`` is given), counting the collectives of each pass."""
    x = x.to(ctx.device).clone().requires_grad_(grad_output is not None)
    out = block(x)
    n_forward = len(ctx.comm.records)
    result = {"output": out.detach(), "forward_collectives": n_forward,
              "forward_bytes": sum(r.size_bytes for r in ctx.comm.records)}
    if grad_output is not None:
        out.backward(grad_output.to(ctx.device))
        backward = ctx.comm.records[n_forward:]
        result.update(grad_x=x.grad, backward_collectives=len(backward),
                      backward_bytes=sum(r.size_bytes for r in backward))
    return result


def tp_mlp(ctx, x, w_gate, w_up, w_down, grad_output=None) -> dict:
    """The gated MLP split across the ranks: gate and up column-parallel (fused into one matrix, as
    Megatron does, so f runs once), the product elementwise and local, down row-parallel.

    Returns the output, the collective counts and bytes of each pass and, with ``grad_output``, the
    gradient of ``x`` and of this rank's weight slices (``grad_gate`` is this rank's rows of the full
    gate gradient, ``grad_down`` its columns of the full down gradient).
    """
    tp, r = ctx.world_size, ctx.rank
    gate_up = ColumnParallelLinear(torch.cat([shard_columns(w_gate, tp)[r], shard_columns(w_up, tp)[r]]),
                                   None, ctx.comm).to(ctx.device)  # (2 d_ff / tp, d_model)
    down = RowParallelLinear.from_full(w_down, None, ctx).to(ctx.device)  # (d_model, d_ff / tp)

    def block(x):
        gate, up = gate_up(x).chunk(2, dim=-1)  # each (b, s, d_ff / tp)
        return down(F.silu(gate) * up)  # (b, s, d_model), summed across ranks by g

    result = _run(ctx, block, x, grad_output)
    if grad_output is not None:
        grad_gate, grad_up = gate_up.weight.grad.chunk(2, dim=0)
        result.update(grad_gate=grad_gate, grad_up=grad_up, grad_down=down.weight.grad)
    return result


def tp_attention(ctx, x, wq, wk, wv, wo, n_heads: int, n_kv_heads: int, grad_output=None) -> dict:
    """Causal GQA split by whole heads: Q, K, V column-parallel (rank r holds query heads
    ``r*H/tp .. (r+1)*H/tp`` and the KV heads they read), attention local, the output projection
    row-parallel over the same heads. One all-reduce forward, one backward."""
    tp, r = ctx.world_size, ctx.rank
    check_heads(n_heads, n_kv_heads, tp)
    head_dim = wq.shape[0] // n_heads
    q_proj = ColumnParallelLinear(shard_columns(wq, tp)[r], None, ctx.comm)  # (H/tp * hd, d)
    kv_proj = ColumnParallelLinear(torch.cat([shard_columns(wk, tp)[r], shard_columns(wv, tp)[r]]), None,
                                   ctx.comm)  # (2 * KV/tp * hd, d)
    o_proj = RowParallelLinear.from_full(wo, None, ctx)  # (d, H/tp * hd)
    for m in (q_proj, kv_proj, o_proj):
        m.to(ctx.device)
    local_heads, local_kv = n_heads // tp, n_kv_heads // tp

    def block(x):
        batch, seq, _ = x.shape
        x = CopyToParallelRegion.apply(x, ctx.comm)  # f once for Q, K and V
        q = F.linear(x, q_proj.weight).view(batch, seq, local_heads, head_dim).transpose(1, 2)
        k, v = F.linear(x, kv_proj.weight).chunk(2, dim=-1)
        k = k.reshape(batch, seq, local_kv, head_dim).transpose(1, 2).repeat_interleave(local_heads // local_kv, 1)
        v = v.reshape(batch, seq, local_kv, head_dim).transpose(1, 2).repeat_interleave(local_heads // local_kv, 1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, H/tp, s, hd): local heads only
        return o_proj(o.transpose(1, 2).reshape(batch, seq, local_heads * head_dim))

    result = _run(ctx, block, x, grad_output)
    if grad_output is not None:
        gk, gv = kv_proj.weight.grad.chunk(2, dim=0)
        result.update(grad_q=q_proj.weight.grad, grad_k=gk, grad_v=gv, grad_o=o_proj.weight.grad)
    return result


def pair_column_then_row(ctx, x, w1, w2, activation=F.gelu) -> dict:
    """The right cut: ``w1`` by columns, ``w2`` by rows. One all-reduce of the output."""
    tp, r = ctx.world_size, ctx.rank
    hidden = activation(F.linear(x, shard_columns(w1, tp)[r]))  # (b, s, d_ff / tp): no communication
    out = ctx.comm.all_reduce(F.linear(hidden, shard_rows(w2, tp)[r]))  # (b, s, d_model): sum of partials
    return {"output": out, "collectives": [(c.op, c.size_bytes) for c in ctx.comm.records]}


def pair_row_then_column(ctx, x, w1, w2, activation=F.gelu) -> dict:
    """The other cut: ``w1`` by rows, ``w2`` by columns. The first product is partial, and the
    activation is not linear, so the partials must be summed *before* it (an all-reduce of the wide
    intermediate); the second product leaves each rank a slice of the output, gathered at the end."""
    tp, r = ctx.world_size, ctx.rank
    x_slice = x.chunk(tp, dim=-1)[r]  # (b, s, d_model / tp): this rank's input features
    hidden = ctx.comm.all_reduce(F.linear(x_slice, shard_rows(w1, tp)[r]))  # (b, s, d_ff): partial -> summed
    out_slice = F.linear(activation(hidden), shard_columns(w2, tp)[r])  # (b, s, d_model / tp)
    out = ctx.comm.all_gather(out_slice, dim=-1)  # (b, s, d_model)
    return {"output": out, "collectives": [(c.op, c.size_bytes) for c in ctx.comm.records]}
