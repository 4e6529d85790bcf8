"""Dropless experts: every token-slot served, however many rows each expert gets (no capacity).

MegaBlocks (Gale et al. 2022, arXiv:2211.15841) and Megatron-Core's MoE layer sort the token-slots by
expert and run each expert on its own contiguous slice of rows, however long. Megatron-Core's
``SequentialMLP`` is this loop over the local experts; its ``GroupedMLP`` does the same in one grouped
GEMM kernel (``grouped_gemm``, CUTLASS). Here it is the loop, each expert's rows on fixed blocks
(``routing.blocked_rows``) so a row's result does not depend on who shared the call. Everything is
differentiable: gathers and ``torch.split`` pass the gradient back to the rows and the weights.

``moe_layer`` is the whole dropless layer in one process (route, sort by expert, the loop, un-sort,
the gate-weighted sum): the one-process reference of ``autograd.moe_forward``. Pure: torch, no ranks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from shardlib.core.experts.balance import switch_aux_loss
from shardlib.core.experts.routing import MoEConfig, Routing, blocked_rows, route
from shardlib.core.toy import mlp_reference


def inverse_permutation(order: torch.Tensor) -> torch.Tensor:
    """``inv`` with ``inv[order[i]] = i``: ``rows[order][inv]`` is ``rows`` again."""
    inv = torch.empty_like(order)
    inv[order] = torch.arange(order.numel(), device=order.device)
    return inv


def grouped_experts(rows: torch.Tensor, counts: list[int], gate: torch.Tensor, up: torch.Tensor,
                    down: torch.Tensor) -> torch.Tensor:
    """Expert ``i``'s gated MLP on its slice of ``rows`` ``(N, d_model)``, which holds ``counts[0]`` rows
    for expert 0, then ``counts[1]`` for expert 1 ...; ``gate``, ``up`` ``(n, d_ff, d_model)``, ``down``
    ``(n, d_model, d_ff)``. Returns ``(N, d_model)`` in the same order."""
    if len(counts) != gate.shape[0] or sum(counts) != rows.shape[0]:
        raise ValueError(f"{len(counts)} counts adding up to {sum(counts)} rows, for {gate.shape[0]} experts and "
                         f"{rows.shape[0]} rows: one count per expert, adding up to the rows")
    d_model = down.shape[1]
    outs = [blocked_rows(lambda b, i=i: mlp_reference(b, gate[i], up[i], down[i]), part, d_model)
            for i, part in enumerate(torch.split(rows, counts))]  # each (counts[i], d_model)
    return torch.cat(outs) if outs else rows.new_zeros(0, d_model)


def gate_weighted_sum(gates: torch.Tensor, slot_outputs: torch.Tensor) -> torch.Tensor:
    """``sum_s gates[:, s] * slot_outputs[:, s]`` for ``gates`` ``(T, k)`` and ``slot_outputs``
    ``(T, k, d_model)``, in slot order (elementwise: a token's result does not depend on the batch)."""
    out = gates[:, 0, None] * slot_outputs[:, 0]  # (T, d_model)
    for s in range(1, gates.shape[1]):
        out = out + gates[:, s, None] * slot_outputs[:, s]
    return out


class LayerOutput(NamedTuple):
    output: torch.Tensor  # (T, d_model), the experts' weighted sum, no residual
    routing: Routing
    counts: torch.Tensor  # (n_experts,) token-slots each expert served
    aux_loss: torch.Tensor  # Switch's auxiliary loss over these tokens (without its coefficient)


def moe_layer(x: torch.Tensor, router: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor,
              cfg: MoEConfig, bias: torch.Tensor | None = None) -> LayerOutput:
    """The dropless layer on ``x`` ``(T, d_model)`` in one process, every expert here."""
    if gate.shape[0] != cfg.n_experts:
        raise ValueError(f"the weights hold {gate.shape[0]} experts, the config says {cfg.n_experts}")
    routing = route(x, router, cfg, bias)
    flat = routing.experts.flatten()  # (T * k,) slot t * k + s
    order = torch.sort(flat, stable=True).indices  # slots grouped by expert, token order inside
    counts = torch.bincount(flat, minlength=cfg.n_experts)  # (E,)
    out = grouped_experts(x[order // cfg.k], counts.tolist(), gate, up, down)  # (T * k, d_model), by expert
    slot_outputs = out[inverse_permutation(order)].view(x.shape[0], cfg.k, -1)  # (T, k, d_model)
    return LayerOutput(gate_weighted_sum(routing.gates, slot_outputs), routing, counts,
                       switch_aux_loss(routing.experts, routing.balance_probs))
