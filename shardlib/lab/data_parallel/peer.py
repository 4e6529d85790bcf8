"""PyTorch's own data parallelism on the same ranks: ``DistributedDataParallel`` and FSDP2's ``fully_shard``.

They train the same model on the same rows with the same AdamW, so they must end where this package's
``ddp`` and ``zero3`` end, within ``core.checks.TOLERANCE``. Both *average* gradients over the ranks,
so each rank's loss is the mean over its own rows (equal shares: the same gradient), and they call
``torch.distributed`` directly, so their traffic is not in the comm log. ``fully_shard`` wraps every
child that holds parameters, then the model, as ``reference.parameter_units`` cuts ZeRO-3's units.
"""

from __future__ import annotations

import torch.nn.functional as F

from shardlib.core.adamw import AdamW
from shardlib.lab.data_parallel.reference import check_training_inputs, local_rows

PEERS = ("torch_ddp", "torch_fsdp2")


def _train(ctx, model, batches, lr: float, parameters) -> None:
    optimizer = AdamW(parameters, lr=lr)
    for x, y in batches:
        mine = local_rows(x.shape[0], ctx.world_size, ctx.rank)
        loss = F.mse_loss(model(x[mine].to(ctx.device)), y[mine].to(ctx.device))  # this rank's rows' mean
        loss.backward()  # the peer averages the gradients over the ranks here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def torch_ddp_on_rank(ctx, model, batches, lr: float) -> dict:
    """Train with ``torch.nn.parallel.DistributedDataParallel``; return the trained ``state_dict``."""
    from torch.nn.parallel import DistributedDataParallel

    check_training_inputs(ctx.world_size, "ddp", model, batches, lr)
    model = model.to(ctx.device)
    wrapped = DistributedDataParallel(model)
    _train(ctx, wrapped, batches, lr, wrapped.parameters())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def torch_fsdp2_on_rank(ctx, model, batches, lr: float) -> dict:
    """Train with FSDP2's ``fully_shard`` (one unit per child with parameters, then the root); return the
    trained ``state_dict``, every tensor gathered whole."""
    from torch.distributed.fsdp import fully_shard

    check_training_inputs(ctx.world_size, "zero3", model, batches, lr)
    mesh = ctx.device_mesh((ctx.world_size,), ("dp",))
    model = model.to(ctx.device)
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    _train(ctx, model, batches, lr, model.parameters())
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in model.state_dict().items()}
