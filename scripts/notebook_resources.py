"""Run notebooks as a learner's Run All would, and measure each: time, and peak memory of kernel and ranks.

    python scripts/notebook_resources.py [notebooks ...] [--python PYTHON] [--cells]

Each notebook is executed top to bottom in a fresh kernel (``jupyter nbconvert --execute``, cell timing
recorded), while the proportional set size (PSS) of the kernel and every process under it (the template
and the ranks) is sampled every 50 ms: PSS splits each shared page between the processes sharing it, so
the sum is what a container's memory limit (a Binder box's 2 GiB) sees. Run All is the time from the
first cell's start to the last cell's end, as the kernel recorded them; the wall time adds the kernel's
own start. ``--cells`` also prints each code cell's time with its first line, slowest first. Used by
``scripts/binder_check.py`` and ``scripts/busy_check.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
MIB = 2 ** 20


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(entry))
    return out


def tree_pss_bytes(root_pid: int) -> int:
    """PSS of ``root_pid`` and all its descendants (shared pages split between the processes sharing them)."""
    children, total, stack = _children(), 0, [root_pid]
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


def tree_cpu_s(root_pid: int, seen: dict[int, float]) -> None:
    """Record in ``seen`` the CPU seconds (user and system) each process of ``root_pid``'s tree has used
    so far: sampled often, their sum is the tree's CPU time, a measure a busy machine disturbs less than
    wall time."""
    children, stack, tick = _children(), [root_pid], os.sysconf("SC_CLK_TCK")
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            seen[pid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        except (OSError, IndexError, ValueError):
            pass


def kernel_pid(root_pid: int) -> int | None:
    """The ipykernel process started under ``root_pid``, if it is running yet."""
    stack, children = [root_pid], _children()
    while stack:
        pid = stack.pop()
        for child in children.get(pid, []):
            try:
                if b"ipykernel" in Path(f"/proc/{child}/cmdline").read_bytes():
                    return child
            except OSError:
                continue
            stack.append(child)
    return None


@dataclass(frozen=True)
class Measurement:
    notebook: str
    passed: bool
    wall_s: float  # nbconvert's whole run: kernel start and every cell
    run_all_s: float  # first cell's start to last cell's end, as the kernel recorded them
    peak_kernel_bytes: int  # the kernel, its template and its ranks
    peak_all_bytes: int  # everything the run started, the converter included
    error: str = ""
    cells: tuple[tuple[int, float, str], ...] = ()  # (code cell's position, seconds, its first line)
    cpu_s: float = 0.0  # CPU seconds of the kernel, its template and its ranks


def _parse(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _run_all_s(executed: Path) -> float:
    cells = json.loads(executed.read_text())["cells"]
    times = [c.get("metadata", {}).get("execution", {}) for c in cells if c["cell_type"] == "code"]
    starts = [t["iopub.execute_input"] for t in times if "iopub.execute_input" in t]
    ends = [t["shell.execute_reply"] for t in times if "shell.execute_reply" in t]
    if not starts or not ends:
        return float("nan")
    return (max(map(_parse, ends)) - min(map(_parse, starts))).total_seconds()


def _cell_times(executed: Path) -> tuple[tuple[int, float, str], ...]:
    """Each code cell's time, from the kernel's receipt of it to its reply, with the cell's first line."""
    code = [c for c in json.loads(executed.read_text())["cells"] if c["cell_type"] == "code"]
    out = []
    for i, c in enumerate(code):
        t = c.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in t and "shell.execute_reply" in t:
            first = next((line for line in "".join(c["source"]).splitlines() if line.strip()), "")
            out.append((i, (_parse(t["shell.execute_reply"]) - _parse(t["iopub.execute_input"])).total_seconds(),
                        first[:70]))
    return tuple(out)


def measure(notebook: Path, python: str = sys.executable, prefix: list[str] | None = None,
            timeout_s: float = 600.0) -> Measurement:
    """Execute ``notebook`` with ``python`` (after ``prefix``, e.g. Binder's start script) and measure it."""
    out = Path(tempfile.mkdtemp()) / notebook.name
    cmd = (prefix or []) + [python, "-m", "jupyter", "nbconvert", "--execute", "--to", "notebook", "--output",
                            str(out), f"--ExecutePreprocessor.timeout={int(timeout_s)}",
                            "--ExecutePreprocessor.record_timing=True", str(notebook)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=notebook.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    peak_kernel = peak_all = 0
    kernel = None
    cpu: dict[int, float] = {}
    while proc.poll() is None:
        kernel = kernel or kernel_pid(proc.pid)
        if kernel:
            peak_kernel = max(peak_kernel, tree_pss_bytes(kernel))
            tree_cpu_s(kernel, cpu)
        peak_all = max(peak_all, tree_pss_bytes(proc.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    log = proc.stdout.read().decode(errors="replace")
    passed = proc.returncode == 0
    return Measurement(notebook.name, passed, wall, _run_all_s(out) if passed else float("nan"), peak_kernel,
                       peak_all, "" if passed else log[-3000:], _cell_times(out) if passed else (),
                       sum(cpu.values()))


HEADER = f"{'notebook':<34}{'result':>8}{'Run All':>10}{'wall':>9}{'kernel + ranks':>16}{'everything':>12}"


def row(m: Measurement) -> str:
    return (f"{m.notebook:<34}{'ok' if m.passed else 'FAILED':>8}{m.run_all_s:>9.1f}s{m.wall_s:>8.1f}s"
            f"{m.peak_kernel_bytes / MIB:>12.0f} MiB{m.peak_all_bytes / MIB:>8.0f} MiB")


def report(results: list[Measurement]) -> str:
    lines = [HEADER] + [row(m) for m in results]
    ok = [m for m in results if m.passed]
    if ok:
        lines.append(f"{'together':<34}{'':>8}{sum(m.run_all_s for m in ok):>9.1f}s{sum(m.wall_s for m in ok):>8.1f}s"
                     f"{max(m.peak_kernel_bytes for m in ok) / MIB:>12.0f} MiB (peak of any one)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=MAIN_NOTEBOOKS)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--cells", action="store_true", help="print each code cell's time, slowest first")
    args = parser.parse_args()
    results = []
    print(HEADER, flush=True)
    for nb in args.notebooks:
        results.append(measure(nb.resolve(), args.python))
        print(row(results[-1]), flush=True)
        if args.cells:
            print(f"    CPU of kernel, template and ranks: {results[-1].cpu_s:.1f} s", flush=True)
            for i, seconds, first in sorted(results[-1].cells, key=lambda c: -c[1]):
                print(f"    cell {i:>3} {seconds:6.2f} s  {first}", flush=True)
    return finish(results)


def finish(results: list[Measurement], heading: str = "") -> int:
    """Print the table of ``results`` (under ``heading``) and each failure's log; the exit status."""
    print(f"\n{heading}" + report(results))
    for m in results:
        if not m.passed:
            print(f"\n{m.notebook} failed:\n{m.error}")
    return 0 if all(m.passed for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
