"""Rehearse Binder on this machine: install as Binder would, run notebook 00, measure its memory.

    python scripts/binder_check.py [--venv /tmp/binder-venv]      (`make binder-check`)

1. A fresh venv installed from ``binder/requirements.txt`` alone, as repo2docker does. The line that
   adds PyTorch's CPU index is dropped when that index cannot be reached: the local CPU wheel of the
   same pinned version stands in for it.
2. Notebook 00 executed in that venv through ``binder/start`` (one thread per rank, loopback gloo),
   while the proportional set size (PSS) of the kernel and every process under it is sampled: the peak
   is what counts against a Binder box's memory (about 2 GB).
3. The browser test against a JupyterLab started from that venv, for notebook 00.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def reachable(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
        return True
    except OSError:
        return False


def install(venv: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    python = venv / "bin" / "python"
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    if not reachable(CPU_INDEX + "/torch/"):
        print(f"{CPU_INDEX} cannot be reached: installing the pinned torch from the local wheel instead")
        lines = [line for line in lines if not line.startswith("--extra-index-url")]
    requirements = venv / "requirements.txt"
    requirements.write_text("\n".join(lines) + "\n")
    started = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)], check=True, cwd=ROOT)
    print(f"installed from binder/requirements.txt in {time.perf_counter() - started:.0f} s")
    return python


def tree_pss_bytes(root_pid: int) -> int:
    """PSS of ``root_pid`` and all its descendants (shared pages split between the processes sharing them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    total, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            pass
    return total


def kernel_pid(root_pid: int) -> int | None:
    """The ipykernel process started under ``root_pid``, if it is running yet."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == root_pid and b"ipykernel" in cmdline:
                return int(entry)
    return None


def run_notebook_00(python: Path) -> tuple[int, int]:
    """Execute notebook 00 under binder/start; return the peak PSS of the kernel with its ranks, and of
    everything the run started (the converter process included)."""
    out = Path(tempfile.mkdtemp()) / "00.ipynb"
    cmd = [str(ROOT / "binder" / "start"), str(python), "-m", "jupyter", "nbconvert", "--execute", "--to",
           "notebook", "--output", str(out), str(ROOT / "notebooks" / "00_start_here.ipynb")]
    proc = subprocess.Popen(cmd, cwd=ROOT / "notebooks")
    peak_kernel = peak_all = 0
    kernel = None
    while proc.poll() is None:
        kernel = kernel or kernel_pid(proc.pid)
        if kernel:
            peak_kernel = max(peak_kernel, tree_pss_bytes(kernel))
        peak_all = max(peak_all, tree_pss_bytes(proc.pid))
        time.sleep(0.05)
    if proc.returncode:
        raise SystemExit(f"notebook 00 failed in the Binder venv (exit {proc.returncode})")
    return peak_kernel, peak_all


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "binder-venv")
    args = parser.parse_args()
    python = install(args.venv)
    peak_kernel, peak_all = run_notebook_00(python)
    print(f"notebook 00 ran in the Binder venv; peak memory (PSS): the kernel with its 2 ranks "
          f"{peak_kernel / 2**20:.0f} MiB, everything including the converter {peak_all / 2**20:.0f} MiB")
    env = dict(os.environ, SHARDLIB_LAB_PYTHON=str(python), SHARDLIB_REQUIRE_BROWSER="1")
    browser = subprocess.run([sys.executable, "-m", "pytest", "tests/browser", "-k", "00_start_here", "-q",
                              "-p", "no:cacheprovider"], cwd=ROOT, env=env)
    if browser.returncode:
        raise SystemExit("the browser test failed against the Binder venv")
    print("Binder rehearsal passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
