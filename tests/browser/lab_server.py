"""A throwaway JupyterLab for the browser test: loopback only, authentication off, its own config.

The notebooks are copied to a temporary folder first, so running them in the browser (and JupyterLab's
autosave) never writes outputs into the repository.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Chromium as root in a container with no network: the flags that keep it quiet and working.
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]

# User settings for this server only: render every cell (JupyterLab 4 otherwise renders only the
# cells in view, and the test reads all of them) and never reach for news or updates.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false", "checkForUpdates": False,
    },
}


def chromium_path() -> str | None:
    """Debian's chromium, or another Chromium-family browser on the PATH (Google Chrome on CI runners)."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """``with LabServer(tmp_path) as lab: lab.url("00_start_here.ipynb")``."""

    def __init__(self, workdir: Path, notebooks: list[Path] | None = None, python: str = sys.executable) -> None:
        self.workdir = Path(workdir)
        self.root = self.workdir / "notebooks"
        self.notebooks = notebooks if notebooks is not None else sorted((REPO / "notebooks").glob("*.ipynb"))
        self.python = python
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log_path = self.workdir / "jupyter-lab.log"

    def url(self, notebook: str) -> str:
        # ?reset: a clean workspace each time, not the tabs of the notebook opened before.
        return f"http://127.0.0.1:{self.port}/lab/tree/{notebook}?reset"

    def __enter__(self) -> "LabServer":
        self.root.mkdir(parents=True, exist_ok=True)
        for nb in self.notebooks:
            shutil.copy(nb, self.root / nb.name)
        env = dict(os.environ)
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
            env[var] = str(self.workdir / var.lower())
        settings = self.workdir / "lab-settings"
        for name, values in SETTINGS.items():
            path = settings / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(values))
        env["JUPYTERLAB_SETTINGS_DIR"] = str(settings)
        # A timing claim that does not hold prints its numbers in the page, as for a learner, instead of failing
        # the cell: make test's nbval run asserts the same claims, alone on the machine, and this run shares
        # the cores with another (scripts/side_by_side.py). Errors of any other kind still fail the test.
        env["SHARDLIB_STRICT_CLAIMS"] = "0"
        cmd = [
            self.python, "-m", "jupyterlab", "--no-browser",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", f"--ServerApp.root_dir={self.root}",
            "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
            "--LabApp.expose_app_in_browser=True",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.root)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited early:\n{self.log_path.read_text()[-3000:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/status", timeout=2)
                return self
            except OSError:
                time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"jupyter lab did not answer within 90 s:\n{self.log_path.read_text()[-3000:]}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
