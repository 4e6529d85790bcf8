"""The mixture-of-experts layer in one process: expert weights, the expert FFN, ``moe_reference``.

Each expert is Llama's gated MLP (``toy.mlp_reference``) on fixed blocks of rows. ``moe_reference`` is
the whole layer with its residual (route, cap, each expert on its token-slots, the gate-weighted sum):
what the expert-parallel layer on ranks must equal, bit for bit. ``simulate_expert_parallel`` moves the
rows of ``dispatch.expert_parallel_moe`` with lists in place of all-to-alls, at any ``ep``. Torch, never
``torch.distributed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..checks import whole_number
from ..toy import generator, mlp_reference, weight
from .balance import Assignment, assign, assign_groups, served_gates, split_groups
from .placement import ExpertPlacement, dispatch_plan
from .routing import MoEConfig, Routing, blocked_rows, check_tokens, route


# -- weights and tokens ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class MoEWeights:
    """Router rows (unit norm) and each expert's gated MLP, stored ``(out, in)`` as ``F.linear`` takes them."""

    router: torch.Tensor  # (n_experts, d_model)
    gate: torch.Tensor  # (n_experts, d_ff, d_model)
    up: torch.Tensor  # (n_experts, d_ff, d_model)
    down: torch.Tensor  # (n_experts, d_model, d_ff)

    @property
    def n_experts(self) -> int:
        return self.router.shape[0]

    @property
    def d_model(self) -> int:
        return self.router.shape[1]

    @property
    def expert_bytes(self) -> int:
        """Bytes of one expert's three matrices."""
        return (self.gate[0].numel() + self.up[0].numel() + self.down[0].numel()) * self.gate.element_size()


def make_moe_weights(cfg: MoEConfig, seed: int = 0) -> MoEWeights:
    """Reproducible weights (``toy.weight``): router rows of norm 1 (so tokens of unit variance give
    logits of unit variance, and no expert is favoured), expert matrices scaled by ``1/sqrt(fan_in)``."""
    g = generator(seed)
    router = weight(g, cfg.n_experts, cfg.d_model)
    router = router / router.norm(dim=1, keepdim=True)
    experts = [(weight(g, cfg.d_ff, cfg.d_model), weight(g, cfg.d_ff, cfg.d_model), weight(g, cfg.d_model, cfg.d_ff))
               for _ in range(cfg.n_experts)]
    gate, up, down = (torch.stack(ws) for ws in zip(*experts))
    return MoEWeights(router=router, gate=gate, up=up, down=down)


def make_tokens(n_tokens: int, d_model: int, seed: int = 1) -> torch.Tensor:
    """``(n_tokens, d_model)`` hidden states of unit variance, reproducible from ``seed``."""
    return torch.randn(whole_number(n_tokens, "n_tokens"), whole_number(d_model, "d_model"), generator=generator(seed))


def expert_ffn(rows: torch.Tensor, weights: MoEWeights, expert: int) -> torch.Tensor:
    """Expert ``expert``'s gated MLP, ``down(silu(gate(x)) * up(x))``, on ``(rows, d_model)``."""
    w_gate, w_up, w_down = weights.gate[expert], weights.up[expert], weights.down[expert]
    return blocked_rows(lambda b: mlp_reference(b, w_gate, w_up, w_down), rows, w_down.shape[0])


def apply_hosted_experts(received: torch.Tensor, counts: torch.Tensor, hosted: tuple[int, ...],
                         weights: MoEWeights) -> torch.Tensor:
    """Run each hosted expert on its rows. ``received`` ``(rows, d_model)`` holds, from each source rank
    in turn, its rows for ``hosted[0]``, then ``hosted[1]``...; ``counts`` is ``(ep, len(hosted))``."""
    out = torch.empty_like(received)  # (rows, d_model)
    ends = counts.flatten().cumsum(0).view_as(counts)  # (ep, len(hosted)): where each block of rows ends
    starts = ends - counts
    for p, e in enumerate(hosted):  # expert e's rows: one block from each source rank
        rows = torch.cat([torch.arange(int(a), int(b)) for a, b in zip(starts[:, p], ends[:, p])])
        if rows.numel():
            out[rows] = expert_ffn(received[rows], weights, e)
    return out



# -- the layer -------------------------------------------------------------------------------------------------
def weighted_sum(x: torch.Tensor, gates: torch.Tensor, slot_outputs: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The layer's output at home: ``x + sum_s gate_s * expert_output_s`` over served slots, in slot
    order (elementwise, so it rounds the same whatever the batch)."""
    out = x.clone()  # (T, d_model): the residual
    for s in range(gates.shape[1]):
        weight = torch.where(kept[:, s], gates[:, s], torch.zeros_like(gates[:, s]))  # (T,)
        out = out + weight[:, None] * slot_outputs[:, s]
    return out


def combine(x: torch.Tensor, routing: Routing, assignment: Assignment, slot_outputs: torch.Tensor,
            cfg: MoEConfig) -> torch.Tensor:
    """``weighted_sum`` of ``slot_outputs`` ``(T * k, d_model)``, in flat slot order, with the gates
    ``cfg``'s policy gives (``routing.served_gates``): the one last step of the layer, in one process or
    at home on a rank."""
    gates = served_gates(routing, assignment, cfg)  # (T, k)
    return weighted_sum(x, gates, slot_outputs.view(x.shape[0], cfg.k, -1), assignment.kept)


@dataclass(frozen=True)
class MoEOutput:
    output: torch.Tensor  # (T, d_model)
    routing: Routing
    assignment: Assignment

    def counts(self, n_experts: int) -> torch.Tensor:
        return self.assignment.counts(n_experts)


def moe_reference(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, n_groups: int = 1) -> MoEOutput:
    """The whole MoE layer with its residual, in one process: route, cap, run each expert on its
    token-slots, weight by the gates. ``n_groups`` contiguous groups get their own capacity (pass the
    world size to compare with the layer on ranks)."""
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    routing = route(x, weights.router, cfg)
    assignment = assign_groups(routing, cfg, n_groups)
    flat_experts, flat_kept = assignment.experts.flatten(), assignment.kept.flatten()  # (T * k,)
    slot_outputs = x.new_zeros(x.shape[0] * cfg.k, x.shape[1])  # (T * k, d_model)
    for e in range(cfg.n_experts):
        slots = torch.nonzero(flat_kept & (flat_experts == e)).flatten()
        if slots.numel():
            slot_outputs[slots] = expert_ffn(x[slots // cfg.k], weights, e)
    return MoEOutput(combine(x, routing, assignment, slot_outputs, cfg), routing, assignment)


def reference_for(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, world_size: int) -> MoEOutput:
    """The single-process layer that the layer on ``world_size`` ranks must equal: each rank's tokens
    form one capacity group."""
    return moe_reference(x, weights, cfg, n_groups=world_size)


def check_layer_inputs(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig, placement: ExpertPlacement,
                       world_size: int) -> None:
    """A ValueError with the numbers if the layer cannot run on ``world_size`` ranks as given."""
    if placement.ep != world_size or placement.n_experts != cfg.n_experts:
        raise ValueError(f"the placement is for {placement.n_experts} experts on {placement.ep} ranks, but "
                         f"the layer has {cfg.n_experts} experts on {world_size} ranks")
    if weights.n_experts != cfg.n_experts or weights.d_model != cfg.d_model:
        raise ValueError(f"the weights hold {weights.n_experts} experts of width {weights.d_model}, the config "
                         f"says {cfg.n_experts} of width {cfg.d_model}")
    check_tokens(x, cfg.d_model, weights.router.dtype)
    split_groups(x.shape[0], world_size)  # every rank needs a token


# -- the same dispatch in one process -----------------------------------------------------------------------------
@dataclass(frozen=True)
class EPSimulation:
    """The expert-parallel layer's data movement, simulated in one process."""

    output: torch.Tensor  # (T, d_model), the home ranks' outputs joined in rank order
    send_matrix: list[list[int]]  # rows sent from rank i (row) to rank j (column)
    expert_rows: list[int]  # rows each rank's experts compute


def simulate_expert_parallel(x: torch.Tensor, weights: MoEWeights, cfg: MoEConfig,
                             placement: ExpertPlacement) -> EPSimulation:
    """``dispatch.expert_parallel_moe`` with lists in place of all-to-alls, for any ``ep``: the same
    dispatch plans, the same expert rows, the same weighted sum at home."""
    w = placement.ep
    check_layer_inputs(x, weights, cfg, placement, w)
    homes = [x[a:b] for a, b in split_groups(x.shape[0], w)]
    routed = [route(h, weights.router, cfg) for h in homes]
    assigned = [assign(r, cfg) for r in routed]
    plans = [dispatch_plan(a.experts, a.kept, placement) for a in assigned]
    sizes = [len(placement.hosted(r)) for r in range(w)]
    offsets = [sum(sizes[:r]) for r in range(w)]
    sends = [torch.split(h[p.order // cfg.k], p.rows_to_rank) for h, p in zip(homes, plans)]  # [src][dst]
    results = []  # [dst] -> output rows split per source
    for dst in range(w):
        counts = torch.stack([p.counts[offsets[dst]:offsets[dst] + sizes[dst]] for p in plans])  # (src, hosted)
        received = torch.cat([sends[src][dst] for src in range(w)])  # (rows, d_model), source by source
        out = apply_hosted_experts(received, counts, placement.hosted(dst), weights)
        results.append(torch.split(out, counts.sum(1).tolist()))
    outputs = []
    for src, (h, r, a, p) in enumerate(zip(homes, routed, assigned, plans)):
        slot_outputs = h.new_zeros(h.shape[0] * cfg.k, cfg.d_model)
        slot_outputs[p.order] = torch.cat([results[dst][src] for dst in range(w)])
        outputs.append(combine(h, r, a, slot_outputs, cfg))
    return EPSimulation(torch.cat(outputs), [p.rows_to_rank for p in plans],
                        [sum(p.rows_to_rank[dst] for p in plans) for dst in range(w)])
