"""The MLP of a toy block with experts, on a rank: the MoE layer (``core.experts.dispatch.moe_layer``,
dropless) on this rank's sequence-parallel tokens, after the attention of a dense block (``step.Block``).

Each rank routes its ``(b, s/tp, d)`` tokens as rows, so the MoE sublayer needs no tp collective; the experts
are spread over ``layout.ep`` ranks of the stage (``Layout.ep_groups``: ep folded onto the tp and
data-parallel ranks, Megatron-Core's expert mesh laid over the attention's). The router is whole on every
rank of the stage and sees only its tokens, so its gradient sums over the stage; each expert's over the ranks
holding it (``step.TrainingStep.moe_parts``). Switch's auxiliary loss is per microbatch: each rank adds its
tokens' share (the microbatch's counts summed over tp, then ``E sum_i f_i P_i`` over its own tokens'
probabilities) to the backward through ``AttachAuxLoss`` (Megatron-Core's ``MoEAuxLossAutoScaler``);
DeepSeek-V3's selection bias moves after the step (``step.TrainingStep.move_biases``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from shardlib.core.experts.dispatch import EXPERT_KEYS, LocalExperts, layer_experts, moe_layer
from shardlib.core.experts.routing import MoEConfig
from shardlib.core.tensor_parallel.layers import TPGroup


class AttachAuxLoss(torch.autograd.Function):
    """Megatron-Core's ``MoEAuxLossAutoScaler``: the forward passes ``h`` through; the backward also hands the
    auxiliary loss ``aux`` the gradient ``scale`` (its weight in the step's loss), so a side loss made on any
    pipeline stage joins the backward the stage already runs."""

    @staticmethod
    def forward(fctx, h, aux, scale):
        fctx.save_for_backward(aux)
        fctx.scale = scale
        return h.view_as(h)

    @staticmethod
    def backward(fctx, grad):
        (aux,) = fctx.saved_tensors
        return grad, torch.full_like(aux, fctx.scale), None


class Experts(nn.Module):
    """The experts this rank holds: the block at its place of its ep group, each a gated MLP."""

    def __init__(self, w: dict, first: int, n_local: int) -> None:
        super().__init__()
        for key, t in zip(EXPERT_KEYS, layer_experts(w, slice(first, first + n_local))):  # (n_local, d_ff, d) ...
            setattr(self, key, nn.Parameter(t.detach().clone()))

    def local(self) -> LocalExperts:
        return LocalExperts(*(getattr(self, k) for k in EXPERT_KEYS))


class RouterWeight(nn.Module):
    def __init__(self, weight) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())  # (n_experts, d_model), whole on every rank


class MoEMLP(nn.Module):
    """The MoE layer of ``cfg`` on this rank's sequence-parallel tokens (the module docstring); ``ctx=None``:
    one process, every expert here. ``aux`` keeps the last microbatch's share of Switch's loss
    (``"aux-loss"``), ``step_counts`` the step's token-slots per expert."""

    def __init__(self, ctx, w: dict, cfg: MoEConfig, groups, tpg: TPGroup, aux_scale: float) -> None:
        super().__init__()
        self.ctx, self.cfg, self.groups, self.tpg, self.aux_scale = ctx, cfg, groups, tpg, aux_scale
        n_local = cfg.experts_per_rank(1 if groups.ep is None else dist.get_world_size(groups.ep))
        self.router, self.experts = RouterWeight(w["router"]), Experts(w, groups.place * n_local, n_local)
        self.bias = torch.zeros(cfg.n_experts, dtype=w["router"].dtype) if cfg.balance == "aux-free" else None
        self.step_counts = torch.zeros(self.cfg.n_experts, dtype=torch.long)
        self.aux = None

    def forward(self, n):  # n (b, s/tp, d), normed: this rank's tokens -> the experts' weighted sum, same shape
        rows = n.reshape(-1, n.shape[-1])  # (b s/tp, d)
        experts, cfg, ep = self.experts.local(), self.cfg, self.groups.ep
        out = moe_layer(rows, self.router.weight, experts, cfg, self.bias, ctx=None if ep is None else self.ctx,
                        group=ep, place=self.groups.place)  # ep = 1: every expert here, no all-to-all
        # every expert weight joins every microbatch's graph, even when the router sent its experts no rows
        y = (out.output + 0 * sum(t.sum() for t in experts)).view(n.shape)
        self.step_counts += out.counts.detach().to(torch.long).cpu()
        if cfg.balance == "aux-loss":
            share = self.aux_share(out.routing.balance_probs, out.counts)
            self.aux = share.detach()
            y = AttachAuxLoss.apply(y, share, self.aux_scale)
        return y

    def aux_share(self, probs, counts):
        """This rank's share of Switch's loss of the microbatch, ``E sum_i f_i P_i``: ``f`` from the counts of
        the microbatch (summed over the tp ranks that hold its tokens), ``P`` over this rank's tokens only
        (``probs`` ``(T_r, E)``, through which the router's gradient flows); ``t = T_r tp`` tokens in all."""
        cfg, t = self.cfg, probs.shape[0] * self.tpg.tp
        counts = self.tpg.all_reduce(counts.detach().to(probs.dtype)) if self.tpg.tp > 1 else counts.to(probs.dtype)
        return cfg.n_experts * (counts / (t * cfg.k) * probs.sum(0) / t).sum()

