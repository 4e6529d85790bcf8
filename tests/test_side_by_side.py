"""scripts/side_by_side.py, make test's last stage: both commands run at once, the second's output after the
first's, never interleaved, and the exit status fails when either failed."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "side_by_side.py"


def side_by_side(first: str, second: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), first, second], capture_output=True, text=True, timeout=60)


def _meet(name: str, other: str, folder: Path) -> str:
    """A command that leaves a mark, then waits (at most 30 s) for the other's: it sees the other's mark
    only if both run at once. The answer is an order of events, not a duration."""
    wait = f"for i in $(seq 600); do [ -e {folder}/{other} ] && break; sleep 0.05; done"
    return (f"echo {name}-a; touch {folder}/{name}; {wait}; [ -e {folder}/{other} ] && echo {name}-saw-{other}; "
            f"echo {name}-b")


def test_both_run_at_once_and_the_second_is_shown_after_the_first(tmp_path):
    done = side_by_side(_meet("first", "second", tmp_path), _meet("second", "first", tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    lines = out.splitlines()
    assert "first-saw-second" in lines and "second-saw-first" in lines  # at once: not one after the other
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
