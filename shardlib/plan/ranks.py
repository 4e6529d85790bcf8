"""A layout on real ranks: tensor parallelism inside a "node", pipeline stages across "nodes".

``combined_forward_on_rank`` runs the toy stack on the mesh of a ``Layout`` (``tp`` innermost, ``pp``
outermost)::

    rank = (stage * dp + replica) * tp + tp_rank

so on 4 ranks with ``pp = 2, tp = 2`` ranks {0, 1} are stage 0 and {2, 3} stage 1: each stage is one
"node" whose two ranks split every block (``tensor_parallel.blocks.ParallelBlock``, Megatron-LM,
Shoeybi et al. 2019), and activations cross between the nodes by point-to-point sends (a GPipe-style
forward, Huang et al. 2019). The process groups come from a torch ``DeviceMesh`` built once per pool
(``ctx.device_mesh``), named ``"tp"``, ``"pp"`` and ``"dp"``, so the comm log splits by mesh axis: many
all-reduces on the tp axis, a few sends and receives on the pp axis. Forward only: serving.

Each rank receives the full weights and keeps only its slices; a real deployment loads only the slices.
"""

from __future__ import annotations

import time

import torch

from ..models import ModelConfig
from ..pipeline.bubble import split_layers
from ..tensor_parallel.blocks import ParallelBlock
from ..tensor_parallel.layers import TPGroup
from .layout import Layout, check_mesh


def combined_forward_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             n_microbatches: int = 2) -> dict:
    """Forward ``x`` (batch, seq, d_model) through the stack on ``layout``'s mesh.

    Replica ``d`` takes its share of the batch and cuts it into ``n_microbatches``. Stage ``s`` holds
    layers ``split_layers(L, pp)[s]``; each microbatch is received from the same tp rank of stage
    ``s - 1``, run through the stage's blocks (two tp all-reduces per block), and sent on to the same tp
    rank of stage ``s + 1``. The last stage returns the output.
    """
    check_mesh(layout, ctx.world_size, "ranks")
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)
    pp_group = mesh.get_group("pp")
    stage, replica, t = layout.coords(ctx.rank)
    tpg = TPGroup.of_mesh(ctx, mesh, "tp")
    blocks = [ParallelBlock(layers[i], model, tpg).to(ctx.device) for i in split_layers(model.n_layers, layout.pp)[stage]]
    part = x.tensor_split(layout.dp)[replica]  # (batch / dp, seq, d_model)
    outputs = []
    start_s = time.perf_counter()
    with torch.no_grad():
        for i, mb in enumerate(part.tensor_split(n_microbatches)):  # (rows, seq, d_model)
            h = mb.clone().to(ctx.device)
            if stage > 0:
                ctx.comm.recv(h, layout.rank(stage - 1, replica, t), group=pp_group)
            with ctx.timeline.span(f"F{i}", kind="compute", stage=stage):
                for block in blocks:
                    h = block(h)
            if stage < layout.pp - 1:
                ctx.comm.send(h, layout.rank(stage + 1, replica, t), group=pp_group)
            else:
                outputs.append(h)
    end_s = time.perf_counter()
    return {"rank": ctx.rank, "stage": stage, "replica": replica, "tp_rank": t,
            "output": torch.cat(outputs) if outputs else None, "start_s": start_s, "end_s": end_s}
