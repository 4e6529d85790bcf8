"""The toy forward and the training step under ``torchrun`` across machines: tp inside each machine.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB \\
        -m shardlib.runtime.launch shardlib.lab.machines:tp_inside_pp_across_on_rank
        (or shardlib.lab.machines:training_across_on_rank pp)

``torchrun`` numbers the processes of a node consecutively and tp is the mesh's innermost axis, so each
tensor-parallel group is one node's G processes (Megatron-LM's all-reduces stay on the fast link); each
node is a pipeline stage (``Layout(tp=G, pp=N)``: GPipe's activations cross the network) or, for training
with ``across="dp"``, a data-parallel replica. Every rank checks itself against the one-process reference
(the toy stack; the training step in float64: its weight shards and the job's loss of every step) and its
traffic per mesh axis against the prediction; ``python -m shardlib.runtime.launch`` exits non-zero above
``TOLERANCE``. Bad input raises ``ValueError`` on every rank before any collective. On a pool, pass
``nodes`` and ``per_node`` (torchrun's ``GROUP_WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` otherwise).
"""

from __future__ import annotations

import os
import socket

import torch

from shardlib.core.checks import TOLERANCE, choice, whole_number
from shardlib.core.mesh import Layout
from shardlib.core.model import stack_reference
from shardlib.core.toy import activations, stack_weights
from shardlib.core.training.config import TrainingConfig
from shardlib.core.training.reference import train_reference
from shardlib.facts.models import TOY
from shardlib.lab.harness import Measured
from shardlib.lab.serving.drivers import check_combined_inputs, combined_forward_on_rank, traffic_by_axis
from shardlib.lab.training.drivers import (
    check_training,
    reference_key,
    step_records,
    traffic_per_step,
    training_on_rank,
)
from shardlib.predict.serving.traffic import AxisTraffic, forward_traffic
from shardlib.predict.training.ledger import predict_traffic


def across_layout(world_size: int, nodes: int, per_node: int, across: str = "pp") -> Layout:
    """One stage (``across="dp"``: one replica) per node, a node's processes its tensor-parallel group.
    ``ValueError`` with the arithmetic when the processes do not fill the nodes evenly."""
    choice(across, ("pp", "dp"), "across (the axis that spans machines)")
    nodes = whole_number(nodes, "nodes (torchrun --nnodes)")
    per_node = whole_number(per_node, "processes per node (torchrun --nproc-per-node)")
    if world_size != nodes * per_node:
        raise ValueError(f"world size {world_size} is not nodes x processes per node = {nodes} x {per_node} = "
                         f"{nodes * per_node}: every node must start the same number of processes "
                         "(the same torchrun --nproc-per-node on each), one stage or replica per node")
    return Layout(tp=per_node, pp=nodes) if across == "pp" else Layout(tp=per_node, pp=1, dp=nodes)


def _from_env(value: int | None, name: str, what: str) -> int:
    if value is not None:
        return value
    if name not in os.environ:
        raise ValueError(f"{what} is not given and {name} is not set: run under torchrun, or pass it "
                         "(nodes=..., per_node=...) when calling on a pool")
    return int(os.environ[name])


def _layout(ctx, nodes: int | None, per_node: int | None, across: str = "pp") -> Layout:
    return across_layout(ctx.world_size, _from_env(nodes, "GROUP_WORLD_SIZE", "nodes"),
                         _from_env(per_node, "LOCAL_WORLD_SIZE", "per_node"), across)


def _by_axis(traffic) -> tuple[dict, dict]:
    """``{axis: calls}``, ``{axis: bytes}`` from ``AxisTraffic`` rows (ops of one axis added up)."""
    calls: dict[str, int] = {}
    size: dict[str, int] = {}
    for a in traffic:
        calls[a.axis] = calls.get(a.axis, 0) + a.count
        size[a.axis] = size.get(a.axis, 0) + a.size_bytes
    return calls, size


def tp_inside_pp_across_on_rank(ctx, batch: int = 4, seq: int = 6, n_microbatches: int = 2, seed: int = 0,
                                nodes: int | None = None, per_node: int | None = None) -> dict:
    """The toy stack (``models.TOY``) with tp = processes per node and pp = nodes; see the module docstring.

    One rank of the job: where it ran, its groups (global ranks), the largest gap to the one-process
    reference over the whole job (``max_error``), and the calls and bytes per mesh axis: the whole job's,
    the prediction's and this rank's own (``my_...``)."""
    layout = _layout(ctx, nodes, per_node)
    node = int(os.environ.get("GROUP_RANK", ctx.rank // layout.tp))
    if node != ctx.rank // layout.tp:
        raise ValueError(f"rank {ctx.rank} is on node {node}, but with {layout.tp} processes per node it should be "
                         f"on node {ctx.rank // layout.tp}: the launcher did not number each node's ranks "
                         "consecutively, so a tensor-parallel group would span nodes")
    layers = stack_weights(TOY, seed=seed)
    x = activations(whole_number(batch, "batch"), whole_number(seq, "seq"), TOY.d_model)  # (batch, seq, d_model)
    check_combined_inputs(layout, TOY, layers, x, n_microbatches)  # every shape rule, before any collective

    output = combined_forward_on_rank(ctx, layout, TOY, layers, x, n_microbatches)["output"]
    mine = traffic_by_axis(ctx.comm.records)  # the forward's calls only: taken before the summary below
    predicted = forward_traffic(TOY, layout, batch, seq, n_microbatches)
    error = 0.0
    if output is not None:  # the last stage: compare with the whole stack in one process
        error = float((output.detach().cpu() - stack_reference(x, layers, TOY)).abs().max())

    # one small all-gather for the job's summary: every rank's error, and its calls and bytes per key
    keys = [(p.axis, p.op) for p in predicted]
    seen = {(a.axis, a.op): a for a in mine}
    row = [error] + [v for key in keys for v in ((seen[key].count, seen[key].size_bytes) if key in seen else (0, 0))]
    unexpected = [a for a in mine if (a.axis, a.op) not in keys]
    row += [sum(a.count for a in unexpected), sum(a.size_bytes for a in unexpected)]
    table = ctx.comm.all_gather(torch.tensor([row], dtype=torch.float64, device=ctx.device)).cpu()  # (ranks, len(row))
    totals = table.sum(0)  # float64 holds these counts exactly
    measured = [AxisTraffic(axis, op, int(totals[1 + 2 * i]), int(totals[2 + 2 * i]))
                for i, (axis, op) in enumerate(keys)]
    (calls, size), (predicted_calls, predicted_bytes), (my_calls, my_bytes) = map(_by_axis, (measured, predicted, mine))
    stage, _, tp_rank = layout.coords(ctx.rank)
    return {"rank": ctx.rank, "node": node, "host": socket.gethostname(), "device": str(ctx.device),
            "backend": ctx.backend, "layout": layout.label, "stage": stage, "tp_rank": tp_rank,
            "tp_group": layout.tp_groups()[stage], "pp_group": layout.pp_groups()[tp_rank],
            "max_error": float(table[:, 0].max()), "tolerance": TOLERANCE, "calls_by_axis": calls,
            "bytes_by_axis": size, "predicted_calls_by_axis": predicted_calls,
            "predicted_bytes_by_axis": predicted_bytes, "my_calls_by_axis": my_calls, "my_bytes_by_axis": my_bytes,
            "traffic_matches_prediction": int(totals[-2]) == 0 and measured == list(predicted)}


def training_across_on_rank(ctx, across: str = "pp", steps: int = 3, nodes: int | None = None,
                            per_node: int | None = None) -> dict:
    """Train the toy language model with tp = processes per node and ``across`` (pp or dp) = nodes."""
    layout = _layout(ctx, nodes, per_node, across)
    config = TrainingConfig(steps=steps, m=max(2, layout.pp), dtype="float64")
    stage_layers = check_training(layout, config)  # every rule, before any collective

    out = training_on_rank(ctx, layout, config, stage_layers)
    me, ref = layout.position(ctx.rank), train_reference(config, layout.dp)
    weight_error = 0.0
    for name, t in out["shards"].items():
        key, dim = reference_key(name)
        piece = ref.weights[key].chunk(layout.tp, dim)[me.tp_rank]  # the reference's slice this rank holds
        weight_error = max(weight_error, float((t - piece).abs().max()))
    records = step_records(Measured((), comm=tuple(ctx.comm.records), timeline=tuple(ctx.timeline.spans)))
    traffic_ok = traffic_per_step(records, steps) == predict_traffic(config, layout, stage_layers, ctx.rank)
    counts = me.tp_rank == 0  # whose losses add up to the job's (0.0 off the last virtual stage)
    row = [weight_error, float(not traffic_ok)] + [v if counts else 0.0 for v in out["losses"]]
    table = ctx.comm.all_gather(torch.tensor([row], dtype=torch.float64, device=ctx.device)).cpu()
    losses = table[:, 2:].sum(0).tolist()
    loss_error = max(abs(a - b) for a, b in zip(losses, ref.losses))
    return {"rank": ctx.rank, "node": ctx.rank // layout.tp, "host": socket.gethostname(), "layout": layout.label,
            "tp_group": next(g for g in layout.tp_groups() if ctx.rank in g), "losses": losses,
            "reference_losses": list(ref.losses), "max_error": max(float(table[:, 0].max()), loss_error),
            "traffic_matches_prediction": bool(table[:, 1].sum() == 0)}
