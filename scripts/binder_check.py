"""Rehearse Binder on this machine: install as Binder would, run every notebook, measure its memory.

    python scripts/binder_check.py [--venv /tmp/binder-venv]      (`make binder-check`)

1. A fresh venv installed from ``binder/requirements.txt`` alone, as repo2docker does. The line that
   adds PyTorch's CPU index is dropped when that index cannot be reached: the local CPU wheel of the
   same pinned version stands in for it.
2. Every main notebook executed in that venv through ``binder/start`` (one thread per rank, loopback
   gloo), while the proportional set size (PSS) of the kernel and every process under it (template and
   ranks) is sampled (``notebook_resources.py``): the peak is what counts against a Binder box's memory
   (about 2 GiB; the suite's own budget is 1.2 GiB per notebook).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notebook_resources import MAIN_NOTEBOOKS, measure, report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BUDGET_BYTES = 1.2 * 2 ** 30


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "binder-venv")
    args = parser.parse_args()
    python = install(args.venv)
    results = [measure(nb, str(python), prefix=[str(ROOT / "binder" / "start")]) for nb in MAIN_NOTEBOOKS]
    print("every notebook in the Binder venv; peak memory is PSS, the kernel with its template and ranks:")
    print(report(results))
    failed = [m for m in results if not m.passed]
    over = [m for m in results if m.peak_kernel_bytes > BUDGET_BYTES]
    if failed:
        raise SystemExit(f"notebooks failed in the Binder venv: {[m.notebook for m in failed]}\n{failed[0].error}")
    if over:
        raise SystemExit(f"over the {BUDGET_BYTES / 2**30:.1f} GiB budget: {[m.notebook for m in over]}")
    env = dict(os.environ, SHARDLIB_LAB_PYTHON=str(python), SHARDLIB_REQUIRE_BROWSER="1")
    browser = subprocess.run([sys.executable, "-m", "pytest", "tests/browser", "-k", "00_start_here", "-q",
                              "-p", "no:cacheprovider"], cwd=ROOT, env=env)
    if browser.returncode:
        raise SystemExit("the browser test failed against the Binder venv")
    print("Binder rehearsal passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
