"""Run two commands at once and fail if either fails: how ``make test`` uses a core the browser test leaves idle.

    python scripts/side_by_side.py "FIRST COMMAND" "SECOND COMMAND"

Each is a shell command line. The first's output is shown as it comes; the second's is kept in a file
and shown whole once both have ended, so the two never interleave. The exit status is the first
non-zero one (the first command's before the second's), or 0. Ctrl-C stops both.

``make test`` runs the browser test (about half of two cores busy: most of it waits for a page or a
kernel) beside the exercise and solution notebooks under nbval and the static site's pages. None checks a
timing claim there: the exercises grade answers, not times, and the browser test leaves the claims to
the nbval run of the main notebooks, which runs alone before it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def side_by_side(first: str, second: str) -> int:
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as kept:
        # each in a process group of its own, so that Ctrl-C stops all it started (3.10 has no process_group)
        own = {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
        shown = subprocess.Popen(["bash", "-c", first], **own)
        beside = subprocess.Popen(["bash", "-c", second], stdout=kept, stderr=subprocess.STDOUT, **own)
        try:
            codes = [shown.wait()]
            first_s = time.perf_counter() - start
            codes.append(beside.wait())
        except KeyboardInterrupt:
            for proc in (shown, beside):
                _stop(proc)
            raise
        total_s = time.perf_counter() - start
        kept.seek(0)
        print(f"\n---- beside it: {second}\n{kept.read()}", flush=True)
    print(f"side by side: the first took {first_s:.0f} s (exit {codes[0]}), both {total_s:.0f} s "
          f"(the second's exit {codes[1]})", flush=True)
    return next((code for code in codes if code), 0)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(side_by_side(sys.argv[1], sys.argv[2]))
