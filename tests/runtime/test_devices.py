"""Where ranks compute, for any GPU count, and the GPU path's pieces that run without a GPU.

The decision (``devices.place_ranks``) takes the GPU count as an argument, so every branch is checked
here on a CPU machine. The host staging of ``comm`` (GPU tensors through host memory for gloo) runs on
CPU ranks with staging switched on: the same copies, the same results as without them.
"""

import pytest
import torch
from conftest import child_pids

import shardlib.runtime.comm
import shardlib.runtime.ranks
from shardlib.runtime.context import RankContext, prepare_device
from shardlib.runtime.devices import Placement, place_ranks
from shardlib.runtime.ranks import Ranks
from shardlib.runtime.timeline import Timeline


@pytest.mark.parametrize("backend, world, gpus, torch_backend, devices, label", [
    ("auto", 2, 0, "gloo", ["cpu"] * 2, "compute on CPU, collectives through loopback sockets (gloo)"),
    ("auto", 4, 1, "gloo", ["cuda:0"] * 4,
     "compute on cuda:0, shared by 4 ranks, collectives through host memory (gloo)"),
    ("auto", 2, 1, "gloo", ["cuda:0"] * 2,
     "compute on cuda:0, shared by 2 ranks, collectives through host memory (gloo)"),
    ("auto", 4, 2, "gloo", ["cuda:0", "cuda:1", "cuda:0", "cuda:1"],
     "compute on cuda:0, cuda:1, shared by 4 ranks, collectives through host memory (gloo)"),
    ("auto", 4, 4, "nccl", ["cuda:0", "cuda:1", "cuda:2", "cuda:3"],
     "compute on cuda:0-3, one GPU per rank, collectives by NCCL"),
    ("auto", 2, 8, "nccl", ["cuda:0", "cuda:1"], "compute on cuda:0, cuda:1, one GPU per rank, collectives by NCCL"),
    ("auto", 1, 1, "nccl", ["cuda:0"], "compute on cuda:0, one GPU per rank, collectives by NCCL"),
    ("gloo", 4, 8, "gloo", ["cpu"] * 4, "compute on CPU, collectives through loopback sockets (gloo)"),
    ("cuda:gloo", 2, 8, "gloo", ["cuda:0", "cuda:1"],
     "compute on cuda:0, cuda:1, collectives through host memory (gloo)"),
    ("cuda:gloo", 3, 2, "gloo", ["cuda:0", "cuda:1", "cuda:0"],
     "compute on cuda:0, cuda:1, shared by 3 ranks, collectives through host memory (gloo)"),
    ("nccl", 2, 2, "nccl", ["cuda:0", "cuda:1"], "compute on cuda:0, cuda:1, one GPU per rank, collectives by NCCL"),
])
def test_placement_follows_the_gpus(backend, world, gpus, torch_backend, devices, label):
    p = place_ranks(backend, world, gpus)
    assert (p.backend, list(p.devices), p.label) == (torch_backend, devices, label)
    assert p.host_staged == (torch_backend == "gloo" and gpus > 0 and backend != "gloo")
    assert place_ranks(p.choice, world, gpus) == p  # the explicit name of what auto chose gives the same


@pytest.mark.parametrize("backend, world, gpus, words", [
    ("nccl", 2, 1, r"backend='nccl' needs one GPU per rank: 2 ranks but this machine has 1 GPU that torch can use"
                   r".*'cuda:gloo' \(ranks share the GPUs"),
    ("nccl", 4, 0, r"4 ranks but this machine has 0 GPUs that torch can use \(NCCL refuses two ranks on one GPU\); "
                   r"use backend='auto' or 'gloo' \(CPU\)$"),
    ("cuda:gloo", 2, 0, r"backend='cuda:gloo' computes on GPUs, but this machine has 0 GPUs"),
    ("mpi", 2, 4, r"unknown backend 'mpi': use 'auto', 'gloo' \(CPU\), 'cuda:gloo'"),
    (3, 2, 4, "unknown backend 3"),
    ("auto", 0, 4, "world_size .* at least 1, got 0"),
    ("auto", 2, -1, "the number of GPUs must be a whole number of at least 0, got -1"),
])
def test_a_placement_that_cannot_work_names_the_gpu_count(backend, world, gpus, words):
    with pytest.raises(ValueError, match=words):
        place_ranks(backend, world, gpus)


def test_nccl_never_puts_two_ranks_on_one_gpu():
    with pytest.raises(ValueError, match=r"NCCL needs one GPU per rank, but devices \['cuda:0', 'cuda:0'\] repeat"):
        Placement("nccl", ("cuda:0", "cuda:0"))


def test_a_pool_refuses_before_starting_anything(monkeypatch):
    monkeypatch.setattr(shardlib.runtime.ranks, "gpu_count", lambda: 2)  # as if this machine had two GPUs
    before = child_pids()
    with pytest.raises(ValueError, match="3 ranks but this machine has 2 GPUs"):
        Ranks(3, backend="nccl")
    assert child_pids() == before


def test_a_gpu_rank_waits_for_its_gpu_and_stages_only_over_gloo():
    cuda = torch.device("cuda", 0)  # a device object only: nothing here touches a GPU
    staged, nccl, cpu = (RankContext(0, 2, cuda, "gloo"), RankContext(0, 2, cuda, "nccl"),
                         RankContext(0, 2, torch.device("cpu"), "gloo"))
    assert (staged.comm.host_staged, nccl.comm.host_staged, cpu.comm.host_staged) == (True, False, False)
    assert staged.timeline._sync == staged.sync and nccl.timeline._sync == nccl.sync and cpu.timeline._sync is None


def test_a_span_covers_the_work_not_its_launch():
    events = []
    timeline = Timeline(0, sync=lambda: events.append("sync"))
    with timeline.span("work"):
        events.append("work")
    timeline.now_s()
    assert events == ["sync", "work", "sync", "sync"]  # the clock is read after each wait for the GPU
    assert [s.name for s in timeline.spans] == ["work"]


def test_prepare_device_turns_tf32_off_on_a_gpu(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)  # as if there were a GPU to select
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.set_float32_matmul_precision("high")
        assert prepare_device("cpu") == torch.device("cpu")
        assert torch.backends.cuda.matmul.allow_tf32 and not chosen  # CPU: nothing changed
        assert prepare_device("cuda:1") == torch.device("cuda", 1) and chosen == [torch.device("cuda", 1)]
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


# -- host staging, run on CPU ranks ---------------------------------------------------------------------
def every_call_on_rank(ctx, staged: bool):
    """Every recorded call, with host staging on or off; returns the results, the log, and which calls
    went through ``stage_on_host``."""
    comm_module = shardlib.runtime.comm
    original, staged_ops = comm_module.stage_on_host, []

    def counting(op, args):
        staged_ops.append(op)
        return original(op, args)

    comm_module.stage_on_host, ctx.comm.host_staged = counting, staged
    try:
        r, n = ctx.rank, ctx.world_size
        x = torch.arange(4.0) + 10 * r  # (4,)
        out = {
            "all_reduce": ctx.comm.all_reduce(x.clone()),
            "all_reduce_async": ctx.comm.all_reduce(x.clone(), op="max", async_op=True).wait(),
            "broadcast": ctx.comm.broadcast(x.clone(), src=1),
            "all_gather_dim1": ctx.comm.all_gather(x.view(2, 2), dim=1),
            "all_gather_async": ctx.comm.all_gather(x, async_op=True).wait(),
            "reduce_scatter": ctx.comm.reduce_scatter(x.clone()),
            "all_to_all": ctx.comm.all_to_all_single(x.clone()),
        }
        counts = [1 + r, 2 - r]  # rank r sends 1 + r rows to rank 0 and 2 - r to rank 1
        rows = torch.arange(3.0).unsqueeze(1) + 100 * r  # (3, 1)
        out["uneven_all_to_all"] = ctx.comm.all_to_all_single(rows, counts, ctx.comm.exchange_counts(counts))
        ring = ctx.comm.isend(x + 0.5, (r + 1) % n), ctx.comm.irecv(torch.zeros(4), (r - 1) % n)
        out["irecv"] = [p.wait() for p in ring][1]
        if r == 0:
            ctx.comm.send(x * 3, 1)
        else:
            out["recv"] = ctx.comm.recv(torch.zeros(4), 0)
        ctx.comm.barrier()
        out["x_unchanged"] = x  # what only sent or gathered is left as it was
        return out, [(rec.op, rec.size_bytes, rec.group) for rec in ctx.comm.records], staged_ops
    finally:
        comm_module.stage_on_host, ctx.comm.host_staged = original, False


def test_host_staging_gives_what_direct_calls_give(pool2):
    direct = pool2.run(every_call_on_rank, False)
    staged = pool2.run(every_call_on_rank, True)
    for (d_out, d_log, d_ops), (s_out, s_log, s_ops) in zip(direct, staged):
        assert d_ops == [] and s_ops == [op for op, _, _ in s_log]  # every call staged, and only when asked
        assert s_log == d_log  # the same calls and the same bytes
        assert d_out.keys() == s_out.keys()
        for key in d_out:
            assert torch.equal(s_out[key], d_out[key]), key
    expected_sum = torch.arange(4.0) * 2 + 10
    assert all(torch.equal(out["all_reduce"], expected_sum) for out, _, _ in staged)
    assert torch.equal(staged[1][0]["recv"], torch.arange(4.0) * 3)


def test_the_environment_can_choose_for_auto(monkeypatch):
    monkeypatch.setattr(shardlib.runtime.ranks, "gpu_count", lambda: 0)
    monkeypatch.setenv("SHARDLIB_BACKEND", "cuda:gloo")
    before = child_pids()
    with pytest.raises(ValueError, match="backend='cuda:gloo' computes on GPUs, but this machine has 0 GPUs"):
        Ranks(2)  # auto, overridden from outside; still checked before anything starts
    assert child_pids() == before
