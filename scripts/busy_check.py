"""Do the notebooks' claims hold on a busy laptop? Run every main notebook beside other work.

    python scripts/busy_check.py [--bursty] [notebooks ...]

A learner's laptop runs a browser, a mail client, a video call. This starts one process that keeps a
core busy (a tight loop, niced to normal priority like any other program), then runs each notebook top to
bottom beside it (``scripts/notebook_resources.py``: pass or fail, Run All time, peak memory), and
prints the table. ``--bursty`` is the other kind of busy: a browser tab or a file indexer that takes a
core for a second or two at irregular moments (busy 0.5 to 2 s, idle 0.5 to 3 s, seeded), which spoils a
single timing far more than a steady load does. Every assert in every notebook must still hold: timing
claims are medians, retries or bands wide enough for a shared machine, and the cells say why.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from notebook_resources import MAIN_NOTEBOOKS, finish, measure  # noqa: E402

HOG = "import time\nwhile True:\n    sum(range(10000))\n"
BURSTS = """import random, time
rng = random.Random(7)
while True:
    end = time.perf_counter() + rng.uniform(0.5, 2.0)
    while time.perf_counter() < end:
        sum(range(10000))
    time.sleep(rng.uniform(0.5, 3.0))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, default=MAIN_NOTEBOOKS)
    parser.add_argument("--bursty", action="store_true", help="bursts of work at irregular moments, not a steady load")
    args = parser.parse_args()
    os.environ["SHARDLIB_STRICT_CLAIMS"] = "1"  # a timing claim the load spoiled fails the notebook, as in CI
    hog = subprocess.Popen([sys.executable, "-c", BURSTS if args.bursty else HOG])
    try:
        results = []
        for nb in args.notebooks:
            results.append(measure(nb.resolve()))
            print(f"{results[-1].notebook}: {'ok' if results[-1].passed else 'FAILED'} "
                  f"({results[-1].run_all_s:.1f} s)", flush=True)
    finally:
        hog.kill()
        hog.wait()
    load = ("with another process taking one core in bursts of 0.5-2 s at irregular moments:\n" if args.bursty
            else "with one core kept busy by another process:\n")
    return finish(results, load)


if __name__ == "__main__":
    sys.exit(main())
