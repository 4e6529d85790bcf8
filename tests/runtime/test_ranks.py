"""The rank runtime: results, by-value functions, errors, timeouts, restarts, no orphans, bad input."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from conftest import alive, child_pids
from rank_fns import die_on, identity, noop, raise_on, skip_barrier_on_last, threads

from shardlib.runtime.context import gpu_count
from shardlib.runtime.devices import place_ranks
from shardlib.runtime.errors import RankError, RankTimeoutError
from shardlib.runtime.ranks import Ranks


def test_results_come_back_in_rank_order_with_args(pool):
    out = pool.run(identity, 1, "two", key=[3])
    assert [o["rank"] for o in out] == list(range(pool.world_size))
    assert all(o["world_size"] == pool.world_size for o in out)
    assert all(o["args"] == (1, "two") and o["kwargs"] == {"key": [3]} for o in out)


def test_lambdas_and_closures_run_by_value(pool2):
    offset = 100
    assert pool2.run(lambda ctx: ctx.rank + offset) == [100, 101]

    def local(ctx, scale):
        return torch.tensor([ctx.rank * scale]).tolist()

    assert pool2.run(local, 2.0) == [[0.0], [2.0]]


def test_functions_defined_in_a_notebook_style_main_module(pool2):
    namespace = {"__name__": "__main__"}
    exec(textwrap.dedent("""
        import torch
        def cell_fn(ctx):
            t = torch.tensor([float(ctx.rank + 1)])
            ctx.comm.all_reduce(t)
            return t.item()
    """), namespace)
    assert namespace["cell_fn"].__module__ == "__main__"
    assert pool2.run(namespace["cell_fn"]) == [3.0, 3.0]


def test_printed_text_comes_back_labelled(pool2, capsys):
    pool2.run(lambda ctx: print(f"hi {ctx.rank}"))
    out = capsys.readouterr().out
    assert "[rank 0] hi 0" in out and "[rank 1] hi 1" in out


def test_context_describes_the_rank(pool2):
    info = pool2.run(lambda ctx: (ctx.rank, ctx.world_size, str(ctx.device), ctx.backend))
    assert info == [(r, 2, pool2.devices[r], pool2.backend) for r in range(2)]
    assert pool2.backend == place_ranks("auto", 2, gpu_count()).backend
    assert pool2.devices == list(pool2.placement.devices)  # where each rank said it is, as placed
    if gpu_count() == 0:  # a machine without GPUs runs on CPU, whatever else it has
        assert pool2.backend == "gloo" and pool2.devices == ["cpu", "cpu"]
        assert pool2.description == "compute on CPU, collectives through loopback sockets (gloo)"


def test_ranks_never_ask_for_more_threads_than_the_machine_has_cores(pool4):
    """Four ranks on a small machine must not each start a full-size thread pool (they would crawl)."""
    per_rank = pool4.run(threads)
    cores = os.cpu_count() or 1
    assert per_rank == [max(1, cores // pool4.world_size)] * pool4.world_size == [pool4.threads_per_rank] * 4
    assert sum(per_rank) <= max(cores, pool4.world_size)


def test_an_error_on_one_rank_is_reported_as_that_ranks_error_and_the_pool_recovers():
    with Ranks(2, timeout=30) as ranks:
        old = ranks.pids
        with pytest.raises(RankError) as info:
            ranks.run(raise_on, 1)  # rank 0 is left waiting in a barrier
        err = info.value
        # rank 1's own error, not the 30 s timeout of the rank left waiting
        assert err.rank == 1 and not isinstance(err, RankTimeoutError)
        assert "deliberate failure on rank 1" in str(err)
        assert "raise_on" in err.remote_traceback and "ValueError" in err.remote_traceback
        assert not any(alive(p) for p in old)
        assert ranks.run(identity)[1]["rank"] == 1


def test_a_rank_that_dies_is_reported_and_replaced():
    with Ranks(2, timeout=30) as ranks:
        with pytest.raises(RankError, match=r"rank 0 died \(exit code 3\)") as info:
            ranks.run(die_on, 0)
        assert info.value.rank == 0
        assert ranks.run(lambda ctx: ctx.rank) == [0, 1]


def test_a_hang_raises_the_timeout_error_and_the_pool_recovers():
    with Ranks(2, timeout=2.0) as ranks:
        started = time.monotonic()
        with pytest.raises(RankTimeoutError) as info:
            ranks.run(skip_barrier_on_last)
        assert time.monotonic() - started >= 2.0  # the timeout waited in full: a floor no load can lower
        assert info.value.ranks_silent == [0] and info.value.rank == 0
        assert "timeout=2 s" in str(info.value)
        assert ranks.run(lambda ctx: ctx.rank) == [0, 1]


def test_a_result_that_cannot_travel_is_a_rank_error():
    with Ranks(2) as ranks:
        with pytest.raises(RankError, match="cannot be sent back"):
            ranks.run(lambda ctx: threading.Lock())
        assert ranks.run(noop) == [None, None]


def test_close_leaves_no_process_and_is_idempotent():
    before = child_pids()
    ranks = Ranks(2)
    pids, parents = ranks.pids, set(ranks.parent_pids)
    assert parents <= child_pids() | {os.getpid()}  # forked from our template, or spawned by us
    ranks.close()
    ranks.close()
    assert not any(alive(p) for p in pids)
    assert child_pids() - parents == before - parents  # no rank left; the template may stay, for the next pool
    with pytest.raises(RuntimeError, match="closed"):
        ranks.run(noop)


def test_ranks_and_their_template_exit_when_the_kernel_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from shardlib import Ranks
        ranks = Ranks(2)
        print(" ".join(map(str, ranks.pids + ranks.parent_pids)), flush=True)
        time.sleep(600)
    """))
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        ranks, templates = set(pids[:2]), set(pids[2:]) - {parent.pid}
        assert len(ranks) == 2 and all(alive(p) for p in ranks | templates)
        assert templates, "the ranks should come from a template, a child of the script"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while any(alive(p) for p in ranks | templates) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in ranks | templates)
    finally:
        parent.kill()


@pytest.mark.parametrize("start", ["template", "spawn"])
def test_a_jupyter_kernel_with_a_pool_shuts_down_by_itself(start):
    """Shut down as JupyterLab does (a shutdown request, then a wait): the kernel exits by itself (code 0),
    not terminated by its manager after half the wait, and leaves no rank or template behind."""
    from jupyter_client.manager import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(cwd=os.getcwd(), env=dict(os.environ))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        found = []
        kc.execute_interactive(
            "from shardlib import Ranks, start_template\n"
            f"start_template()\nranks = Ranks(2, start={start!r})\n"
            "print(*(ranks.pids + ranks.parent_pids))",
            timeout=120, output_hook=lambda msg: found.extend(msg["content"].get("text", "").split()))
        pids = {int(p) for p in found}
        assert len(pids) >= 3, found  # two ranks, and their parent: the template or the kernel
        kernel = km.provisioner.process
        km.shutdown_kernel(now=False)
        assert kernel.returncode == 0, f"the kernel was stopped with signal {-kernel.returncode}"
        deadline = time.monotonic() + 5
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids)
    finally:
        kc.stop_channels()
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def test_ranks_forked_from_the_template_and_spawned_ones_give_the_same_answers():
    with Ranks(2, start="spawn") as spawned:
        assert spawned.parent_pids == [os.getpid()] * 2  # fresh Pythons, children of this process
        assert spawned.run(lambda ctx: ctx.comm.all_reduce(torch.ones(2)).tolist()) == [[2.0, 2.0]] * 2
    with Ranks(2, start="template") as forked:
        template = forked.parent_pids[0]
        assert template != os.getpid() and set(forked.parent_pids) == {template}
        assert forked.run(lambda ctx: ctx.comm.all_reduce(torch.ones(2)).tolist()) == [[2.0, 2.0]] * 2
    with Ranks(2, start="template") as again:  # the next pool comes from the same template
        assert set(again.parent_pids) == {template}


def test_the_template_forks_from_a_single_thread_and_a_killed_template_is_replaced(tmp_path):
    """Run in a process of its own: killing the template takes every pool of that process with it."""
    script = tmp_path / "kill_template.py"
    script.write_text(textwrap.dedent("""
        import os, signal, time
        from shardlib import Ranks, RankError
        from shardlib.runtime.launcher import get_template

        first = Ranks(2, start="template")
        template = get_template(60.0)
        assert template.pid == first.parent_pids[0] and template.info["threads"] == 1
        ranks = first.pids
        os.kill(template.pid, signal.SIGKILL)  # the template goes, and its ranks with it
        deadline = time.monotonic() + 5
        while any(os.path.exists(f"/proc/{p}") and open(f"/proc/{p}/stat").read().split()[2] != "Z"
                  for p in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            first.run(lambda ctx: None)
        except RankError as err:
            print("REPORTED", str(err).splitlines()[0])
        print("AFTER", first.run(lambda ctx: ctx.rank), first.parent_pids[0] != template.pid)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"REPORTED rank [01] died", out.stdout)  # reported, not a broken pipe (either rank first)
    assert "AFTER [0, 1] True" in out.stdout  # the pool came back on a new template


def test_a_template_started_early_serves_the_first_pool(tmp_path):
    """``start_template`` returns before the template is ready; the first pool waits for that one and forks
    its ranks from it. Run in a process of its own, which has no template yet."""
    script = tmp_path / "early.py"
    script.write_text(textwrap.dedent("""
        from shardlib import Ranks, start_template
        from shardlib.runtime import launcher

        print("STARTED", start_template(), start_template())  # one template per process
        template = launcher._TEMPLATE
        print("PENDING", template.info is None)
        with Ranks(2) as ranks:
            print("FORKED", set(ranks.parent_pids) == {template.pid}, ranks.run(lambda ctx: ctx.rank))
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env=dict(os.environ, SHARDLIB_START="template"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "STARTED True False" in out.stdout and "FORKED True [0, 1]" in out.stdout, out.stdout


def test_start_template_does_nothing_where_ranks_are_spawned(tmp_path):
    script = tmp_path / "spawned.py"
    script.write_text("from shardlib import start_template\nfrom shardlib.runtime import launcher\n"
                      "print(start_template(), launcher._TEMPLATE)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env=dict(os.environ, SHARDLIB_START="spawn"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None"]


def test_two_kernels_never_share_a_template(tmp_path):
    script = tmp_path / "kernel.py"
    script.write_text("from shardlib import Ranks\nr = Ranks(2)\nprint(r.parent_pids[0])\nr.close()\n")
    outs = [subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180)
            for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
    templates = [int(o.stdout.split()[-1]) for o in outs]
    assert templates[0] != templates[1]


def test_nothing_listens_beyond_loopback(pool2):
    import psutil

    processes = [psutil.Process()] + [psutil.Process(p) for p in set(pool2.pids + pool2.parent_pids)]
    listening = [c.laddr for p in processes for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    assert listening, "the store at least listens"
    assert all(addr.ip in ("127.0.0.1", "::1") for addr in listening), listening


def test_two_pools_at_once_do_not_collide(pool2):
    with Ranks(2) as other:
        results = {}
        t = threading.Thread(target=lambda: results.setdefault("other", [other.run(identity) for _ in range(20)]))
        t.start()
        mine = [pool2.run(lambda ctx: ctx.comm.all_reduce(torch.ones(1)).item()) for _ in range(20)]
        t.join()
        assert mine == [[2.0, 2.0]] * 20
        assert len(results["other"]) == 20


def test_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "first_script.py"
    script.write_text(textwrap.dedent("""
        import torch
        from shardlib import Ranks

        def total(ctx):
            t = torch.tensor([float(ctx.rank + 1)])
            ctx.comm.all_reduce(t)
            return t.item()

        ranks = Ranks(2)
        print("RESULT", ranks.run(total))
        ranks.close()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "RESULT [3.0, 3.0]" in out.stdout


@pytest.mark.parametrize("world_size, error, words", [
    (0, ValueError, "at least 1"),
    (-1, ValueError, "at least 1"),
    (2.5, ValueError, "whole number"),
    ("2", ValueError, "whole number"),
    (True, ValueError, "whole number"),
    (10_000, ValueError, "far beyond this machine"),
])
def test_bad_world_sizes_are_refused_without_starting_anything(world_size, error, words):
    before = child_pids()
    with pytest.raises(error, match=words):
        Ranks(world_size)
    assert child_pids() == before


@pytest.mark.parametrize("kwargs, error, words", [
    ({"backend": "nccl"}, ValueError, "needs one GPU per rank"),
    ({"backend": "cuda:gloo"}, ValueError, "computes on GPUs, but this machine has 0 GPUs"),
    ({"backend": "mpi"}, ValueError, "unknown backend"),
    ({"backend": 3}, ValueError, "unknown backend 3"),
    ({"timeout": 0}, ValueError, r"timeout \(seconds\) must be a positive number"),
    ({"timeout": "60"}, ValueError, r"timeout \(seconds\) must be a positive number"),
    ({"start": "teleport"}, ValueError, "unknown start method 'teleport'"),
])
def test_bad_options_are_refused_without_starting_anything(kwargs, error, words):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has enough GPUs for NCCL")
    if kwargs.get("backend") == "cuda:gloo" and torch.cuda.device_count():
        pytest.skip("this machine has a GPU to share")
    before = child_pids()
    with pytest.raises(error, match=words):
        Ranks(2, **kwargs)
    assert child_pids() == before


def test_non_callables_and_unshippable_arguments_are_type_errors(pool2):
    with pytest.raises(TypeError, match="needs a function"):
        pool2.run(42)
    with pytest.raises(TypeError, match=r"argument 1 \(lock\) cannot be sent to the ranks"):
        pool2.run(identity, 1, threading.Lock())
    with pytest.raises(TypeError, match=r"argument key= \(generator\) cannot be sent"):
        pool2.run(identity, key=(i for i in range(3)))
    assert pool2.run(noop) == [None, None]


def test_same_threads_computes_with_a_ranks_threads_and_restores_them(pool2):
    import torch

    before = torch.get_num_threads()
    with pool2.same_threads():
        inside = torch.get_num_threads()
    assert inside == pool2.threads_per_rank == pool2.run(lambda ctx: torch.get_num_threads())[0]
    assert torch.get_num_threads() == before


def _fragment_the_heap(ctx, pieces: int = 400) -> int:
    """Allocate ``pieces`` tensors of 64 KB (below malloc's mmap threshold: they come from the heap), keep one in
    twenty past the call and free the rest: the kept ones pin the heap, so without a trim the freed pages
    between them stay in the rank. Returns the rank's resident bytes with all of them alive."""
    import gc

    chunks = [torch.ones(16 * 1024) for _ in range(pieces)]  # 64 KB each: 25 MB
    ctx.__dict__.setdefault("kept", []).extend(chunks[::20])  # 1.3 MB kept, spread over the 25
    alive = _resident_bytes(ctx)
    del chunks
    gc.collect()
    return alive


def _resident_bytes(ctx) -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; malloc_trim is glibc's")
def test_a_rank_gives_back_the_memory_its_call_freed(pool2):
    before = pool2.run(_resident_bytes)
    alive = pool2.run(_fragment_the_heap)
    after = pool2.run(_resident_bytes)
    for b, a, c in zip(before, alive, after):
        assert a - b > 20e6  # the 25 MB were resident during the call
        assert c - b < 5e6, f"resident {b / 1e6:.0f} MB before, {a / 1e6:.0f} during, {c / 1e6:.0f} after"
