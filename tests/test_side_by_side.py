"""scripts/side_by_side.py, make test's last stage: both commands run at once, the second's output after the
first's, never interleaved, and the exit status fails when either failed."""

import subprocess
import sys
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "side_by_side.py"


def side_by_side(first: str, second: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), first, second], capture_output=True, text=True, timeout=60)


def test_both_run_at_once_and_the_second_is_shown_after_the_first():
    start = time.perf_counter()
    done = side_by_side("echo first-a; sleep 1; echo first-b", "echo second-a; sleep 1; echo second-b")
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.perf_counter() - start < 1.9  # at once: not one second after the other
    out = done.stdout
    assert out.index("first-a") < out.index("first-b") < out.index("second-a") < out.index("second-b")
    assert "---- beside it: echo second-a" in out and "the second's exit 0" in out


def test_either_failing_fails_the_stage_with_its_status():
    assert side_by_side("exit 3", "true").returncode == 3
    assert side_by_side("true", "echo broken; exit 5").returncode == 5
    assert side_by_side("exit 3", "exit 5").returncode == 3  # the first's before the second's
    shown = side_by_side("true", "echo broken; exit 5").stdout
    assert "broken" in shown and "the second's exit 5" in shown


def test_without_two_commands_it_says_how_to_call_it():
    done = subprocess.run([sys.executable, str(SCRIPT), "true"], capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "FIRST COMMAND" in done.stderr
