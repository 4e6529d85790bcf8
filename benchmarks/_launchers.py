"""Per-call launchers to compare against the warm pool: start ranks, join, all-reduce, tear down.

Kept in a module of its own with only torch imported, so spawned children import no more than a
plain ``mp.spawn`` script would.
"""

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, n_elements, ready, hold):
    torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=120))
    dist.barrier()
    if n_elements:
        dist.all_reduce(torch.ones(n_elements))
    if ready is not None:
        ready.put(rank)
    if hold is not None:
        hold.wait()
    dist.destroy_process_group()


def start_join_allreduce_exit(start_method: str, world_size: int = 2, n_elements: int = 1024) -> None:
    """One live-cell re-run the per-call way: new processes, new group, one all-reduce, exit."""
    ctx = mp.start_processes(_rank_main, args=(world_size, free_port(), n_elements, None, None),
                             nprocs=world_size, start_method=start_method, join=True)
    del ctx


def start_until_ready(world_size: int = 2):
    """Cold start the plain way (torch's mp.spawn): returns once every rank has joined the group;
    call the returned function to release and join them."""
    smp = mp.get_context("spawn")
    ready, hold = smp.Queue(), smp.Event()
    ctx = mp.start_processes(_rank_main, args=(world_size, free_port(), 0, ready, hold), nprocs=world_size,
                             start_method="spawn", join=False)
    for _ in range(world_size):
        ready.get(timeout=180)

    def finish():
        hold.set()
        while not ctx.join():
            pass

    return finish
