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

``decode_on_rank`` runs the same mesh the way a server decodes (``plan.decode``'s steady state): the
batch's microbatches chase each other round the stages, the last stage handing each one's output back
to the first as its next input, so no stage waits for a fill or a drain between steps.

Each rank receives the full weights and keeps only its slices; a real deployment loads only the slices.
"""

from __future__ import annotations

import time

import torch

from ..models import ModelConfig
from ..pipeline.predict import split_layers
from ..plan.layout import Layout, check_mesh
from ..plan.memory import active_params_per_gpu
from ..tensor_parallel.blocks import ParallelBlock
from ..tensor_parallel.layers import TPGroup
from ..toy import activations, stack_reference


def _stage_blocks(ctx, layout: Layout, model: ModelConfig, layers: list[dict]):
    """This rank's mesh coordinates, its pp group, and its stage's blocks split over its tp group."""
    check_mesh(layout, ctx.world_size, "ranks")
    mesh = ctx.device_mesh(layout.mesh_shape, layout.mesh_axes)
    stage, replica, t = layout.coords(ctx.rank)
    tpg = TPGroup.of_mesh(ctx, mesh, "tp")
    blocks = [ParallelBlock(layers[i], model, tpg).to(ctx.device) for i in split_layers(model.n_layers, layout.pp)[stage]]
    return (stage, replica, t), mesh.get_group("pp"), blocks


def combined_forward_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                             n_microbatches: int = 2) -> dict:
    """Forward ``x`` (batch, seq, d_model) through the stack on ``layout``'s mesh.

    Replica ``d`` takes its share of the batch and cuts it into ``n_microbatches``. Stage ``s`` holds
    layers ``split_layers(L, pp)[s]``; each microbatch is received from the same tp rank of stage
    ``s - 1``, run through the stage's blocks (two tp all-reduces per block), and sent on to the same tp
    rank of stage ``s + 1``. The last stage returns the output.
    """
    (stage, replica, t), pp_group, blocks = _stage_blocks(ctx, layout, model, layers)
    part = x.tensor_split(layout.dp)[replica]  # (batch / dp, seq, d_model)
    outputs = []
    ctx.comm.barrier()  # a start line: every rank has built its blocks (the driver leaves it out of the traffic)
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


def decode_on_rank(ctx, layout: Layout, model: ModelConfig, layers: list[dict], x: torch.Tensor,
                   n_microbatches: int, steps: int, emulation=None) -> dict:
    """``steps`` decode steps of ``x`` (batch, 1, d_model) on ``layout``'s mesh, pipelined in steady state.

    Replica ``d`` cuts its share of the batch into ``n_microbatches``. Each stage, for every step and
    microbatch in turn: receive it (from the previous stage; the first stage, after step 0, from the
    last), run its blocks, send it on without waiting (``isend``: the stage goes straight to the next
    microbatch). The last stage keeps each output and the time it was ready. ``emulation`` (an
    ``EmulatedLink``) makes calls that cross "nodes" last as long as that link would.
    """
    if emulation is not None:
        ctx.comm.emulate(emulation)
    (stage, replica, t), pp_group, blocks = _stage_blocks(ctx, layout, model, layers)
    pp, first, last = layout.pp, stage == 0, stage == layout.pp - 1
    src, dst = layout.rank((stage - 1) % pp, replica, t), layout.rank((stage + 1) % pp, replica, t)
    buffers = [mb.clone().to(ctx.device) for mb in x.tensor_split(layout.dp)[replica].tensor_split(n_microbatches)]
    outputs, ready_s, sends = [], [], []
    start_s = time.perf_counter()
    with torch.no_grad():
        for step in range(steps):
            for i, h in enumerate(buffers):  # h: (rows, 1, d_model), this microbatch's input this step
                if pp > 1 and not (first and step == 0):
                    ctx.comm.recv(h, src, group=pp_group)
                with ctx.timeline.span(f"T{step}.{i}", kind="compute", stage=stage):
                    for block in blocks:
                        h = block(h)
                if last:
                    outputs.append(h)
                    ready_s.append(time.perf_counter())
                if pp == 1:
                    buffers[i] = h  # the next step's input, here on this rank
                elif not (last and step == steps - 1):
                    sends.append(ctx.comm.isend(h, dst, group=pp_group))
        for pending in sends:
            pending.wait()
    end_s = time.perf_counter()
    m = len(buffers)
    return {"rank": ctx.rank, "stage": stage, "replica": replica, "tp_rank": t, "start_s": start_s, "end_s": end_s,
            # (steps, batch / dp, 1, d_model) and (steps, m) on the last stage
            "outputs": torch.stack([torch.cat(outputs[k * m:(k + 1) * m]) for k in range(steps)]) if last else None,
            "ready_s": [ready_s[k * m:(k + 1) * m] for k in range(steps)] if last else None}


def effective_flops_per_s(model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 5) -> float:
    """This process's arithmetic speed on the stack, as the planner counts work: ``2 x active parameters
    x tokens`` (``memory.active_params_per_gpu``) over the fastest of ``repeats`` timed forwards of
    ``batch`` sequences of ``seq`` tokens. On tiny matrices it is far below the CPU's peak: dispatch
    overhead dominates, and that is what the toy's compute proxy should include."""
    x = activations(batch, seq, model.d_model)
    best_s = float("inf")
    with torch.no_grad():
        stack_reference(x, layers, model)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            stack_reference(x, layers, model)
            best_s = min(best_s, time.perf_counter() - start)
    return 2 * active_params_per_gpu(model, Layout(tp=1, pp=1)) * batch * seq / best_s


def effective_flops_on_rank(ctx, model: ModelConfig, layers: list[dict], batch: int, seq: int, repeats: int = 10) -> float:
    """``effective_flops_per_s`` on a rank. Run on every rank at once, it sees what the ranks of a run
    see: the cores they share, the threads they have, each other."""
    return effective_flops_per_s(model, layers, batch, seq, repeats)
