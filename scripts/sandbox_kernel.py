"""The kernel that grades a submission: the student's code cannot write the course or read the other students' work.

A submission is untrusted code. ``scripts/course.py grade`` runs each one in this kernel (Linux, where
unprivileged user namespaces are allowed; elsewhere it says so and grades without it). Started as

    unshare --user --map-root-user --mount --propagation private \\
        python scripts/sandbox_kernel.py --course COURSE --protect PATH ... -- -f CONNECTION_FILE

it runs in a user and a mount namespace of its own and, before the kernel starts:

- remounts read-only the course directory and each ``--protect`` path (the repository: the graders, the
  library, the virtual environment; the Python installation; the instructor's home);
- covers the students' folders (``submitted/``, ``autograded/``, ``feedback/``, the exchange) with an empty
  read-only tmpfs, and the gradebook with an empty read-only file;
- moves into a fresh folder under /tmp, which becomes its home too;
- drops every capability (``setpriv``), so that nothing the student writes can undo a mount.

What stays open: /tmp and loopback sockets (the ranks need them), CPU and memory (the cell timeout bounds the
time), and reading files the instructor's user can read outside the paths above. nbgrader itself, outside the
namespace, still writes the gradebook and the feedback.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

STUDENTS_FOLDERS = ("submitted", "autograded", "feedback", "exchange")
DROP_EVERYTHING = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs"]


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the grading sandbox could not mount {' '.join(args)}: {done.stderr.strip()}")


def seal(course: Path, protect: list[Path]) -> None:
    """The course and the ``protect`` paths read-only; the students' folders and the gradebook out of sight."""
    for path in [*protect, course]:
        if path.exists():
            _mount("--bind", str(path), str(path))
            _mount("-o", "remount,bind,ro", str(path))
    for name in STUDENTS_FOLDERS:
        if (course / name).is_dir():
            _mount("-t", "tmpfs", "-o", "ro,size=4k,mode=555", "students", str(course / name))
    if (course / "gradebook.db").is_file():  # an empty file in its place, read-only
        _mount("--bind", tempfile.mkstemp(prefix="no-gradebook-")[1], str(course / "gradebook.db"))
        _mount("-o", "remount,bind,ro", str(course / "gradebook.db"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--course", type=Path, required=True)
    parser.add_argument("--protect", type=Path, action="append", default=[])
    parser.add_argument("--probe", action="store_true", help="seal, then check that the course cannot be written")
    parser.add_argument("kernel_args", nargs=argparse.REMAINDER, help="after --: the kernel's arguments")
    args = parser.parse_args(argv)
    seal(args.course.resolve(), [p.resolve() for p in args.protect])
    home = tempfile.mkdtemp(prefix="grading-")
    os.chdir(home)
    os.environ.update(HOME=home, IPYTHONDIR=os.path.join(home, ".ipython"))
    if args.probe:  # exits 0 only if, without capabilities, writing the course fails
        check = ("import sys\ntry:\n    open(sys.argv[1], 'w')\nexcept OSError:\n    sys.exit(0)\nsys.exit(1)")
        command = [sys.executable, "-c", check, str(args.course.resolve() / "sandbox-probe")]
    else:
        kernel_args = args.kernel_args[1:] if args.kernel_args[:1] == ["--"] else args.kernel_args
        command = [sys.executable, "-m", "ipykernel_launcher", *kernel_args]
    os.execvp(DROP_EVERYTHING[0], [*DROP_EVERYTHING, *command])


if __name__ == "__main__":
    main()
