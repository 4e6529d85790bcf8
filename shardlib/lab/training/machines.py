"""The training step under ``torchrun`` across machines: tp inside each machine, pp or dp across them.

    torchrun --nnodes N --nproc-per-node G --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id JOB \\
        -m shardlib.runtime.launch shardlib.lab.training.machines:training_across_on_rank pp

``torchrun`` numbers a node's processes consecutively and tp is the mesh's innermost axis, so each
tensor-parallel group is one node's G processes; ``across="pp"`` makes each node a pipeline stage
(``Layout(tp=G, pp=N)``), ``across="dp"`` a data-parallel replica (``Layout(tp=G, pp=1, dp=N)``). Every
rank trains (``ranks.training_on_rank``, float64), then trains the one-process reference itself and
compares: its own weight shards with the reference's slices, and the job's loss of every step (one small
all-gather). ``max_error`` is the largest gap; ``python -m shardlib.runtime.launch`` exits non-zero above
``TOLERANCE``. The rank's traffic per axis is checked against ``predict.predict_traffic``. Every layout
rule is checked before any collective.
"""

from __future__ import annotations

import os
import socket

import torch

from shardlib.core.checks import choice
from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig
from shardlib.core.training.reference import train_reference
from shardlib.lab.harness import Measured
from shardlib.lab.training.drivers import check_training, reference_key, step_records, traffic_per_step
from shardlib.lab.training.ranks import training_on_rank
from shardlib.predict.training.ledger import predict_traffic


def _count(value, name: str, what: str) -> int:
    if value is None:
        if name not in os.environ:
            raise ValueError(f"{what} is not given and {name} is not set: run under torchrun, or pass it")
        value = os.environ[name]
    return int(value)


def training_across_on_rank(ctx, across: str = "pp", steps: int = 3, nodes: int | None = None,
                            per_node: int | None = None) -> dict:
    """Train the toy language model with tp = processes per node and ``across`` (pp or dp) = nodes."""
    choice(across, ("pp", "dp"), "across (the axis that spans machines)")
    nodes = _count(nodes, "GROUP_WORLD_SIZE", "nodes")
    per_node = _count(per_node, "LOCAL_WORLD_SIZE", "per_node")
    if nodes * per_node != ctx.world_size:
        raise ValueError(f"world size {ctx.world_size} is not nodes x processes per node = {nodes} x {per_node}")
    layout = Layout(tp=per_node, pp=nodes) if across == "pp" else Layout(tp=per_node, pp=1, dp=nodes)
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
    return {"rank": ctx.rank, "node": ctx.rank // per_node, "host": socket.gethostname(), "layout": layout.label,
            "tp_group": next(g for g in layout.tp_groups() if ctx.rank in g), "losses": losses,
            "reference_losses": list(ref.losses), "max_error": max(float(table[:, 0].max()), loss_error),
            "traffic_matches_prediction": bool(table[:, 1].sum() == 0)}
