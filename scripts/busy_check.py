"""Do the notebooks' claims hold on a busy laptop? Run every main notebook with one core kept busy.

    python scripts/busy_check.py [notebooks ...]

A learner's laptop runs a browser, a mail client, a video call. This starts one process that keeps a
core busy (a tight loop, niced to normal priority like any other program), then runs each notebook top to
bottom beside it (``scripts/notebook_resources.py``: pass or fail, Run All time, peak memory), and
prints the table. Every assert in every notebook must still hold: timing claims are medians, retries or
bands wide enough for a shared machine, and the cells say why.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notebook_resources import MAIN_NOTEBOOKS, finish, measure  # noqa: E402

HOG = "import time\nwhile True:\n    sum(range(10000))\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=MAIN_NOTEBOOKS)
    args = parser.parse_args()
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        results = []
        for nb in args.notebooks:
            results.append(measure(nb.resolve()))
            print(f"{results[-1].notebook}: {'ok' if results[-1].passed else 'FAILED'} "
                  f"({results[-1].run_all_s:.1f} s)", flush=True)
    finally:
        hog.kill()
        hog.wait()
    return finish(results, "with one core kept busy by another process:\n")


if __name__ == "__main__":
    sys.exit(main())
