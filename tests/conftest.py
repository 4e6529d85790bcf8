import os

import pytest

from shardlib.runtime.ranks import Ranks


def child_pids(pid: int | None = None) -> set[int]:
    """Live (non-zombie) direct children of ``pid`` (default: this process), read from /proc."""
    pid = os.getpid() if pid is None else pid
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, ppid = fields[0], int(fields[1])
        if ppid == pid and state != "Z":
            out.add(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="session")
def pool2():
    with Ranks(2) as ranks:
        yield ranks


@pytest.fixture(scope="session")
def pool4():
    with Ranks(4) as ranks:
        yield ranks


@pytest.fixture(params=[2, 4], ids=["world2", "world4"])
def pool(request):
    return request.getfixturevalue(f"pool{request.param}")


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread in this process for a module, as a rank has: two threads beside busy ranks on two
    cores crawl. A module asks for it with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
