"""One execution of each notebook serves two checks: nbval's, and the website's pages.

With ``SHARDLIB_EXECUTED_DIR`` set (``make test`` sets it), the nbval run of a main notebook
(``notebooks/NN_*.ipynb``) first installs the static widgets in its kernel (``shardlib.ui.static``, as
``scripts/build_site.py`` does), keeps every cell's outputs, and saves the executed notebook into that
folder when the notebook's last cell has run. ``tests/static_site`` then builds the website from them
instead of executing every notebook again. Without the variable, nothing is saved. Under nbval the
kernels' timing claims are strict (``SHARDLIB_STRICT_CLAIMS=1``, unless already set): a claim a busy machine
spoiled fails the run, as it only prints its numbers in a learner's kernel. It lives beside the notebooks so
that it applies to their cells only (and no module named ``conftest`` sits at the root).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# nbval asserts the notebooks' timing claims: their kernels (started after this) run strict unless told otherwise
os.environ.setdefault("SHARDLIB_STRICT_CLAIMS", "1")
EXECUTED = os.environ.get("SHARDLIB_EXECUTED_DIR")
_outputs: dict[Path, dict[int, list]] = {}
_installed: set[Path] = set()


def _main_notebook(item) -> Path | None:
    """The notebook of an nbval cell item, if it is one of the course's main notebooks."""
    if not EXECUTED or type(item).__name__ != "IPyNbCell":
        return None
    path = Path(str(item.parent.fspath)).resolve()
    return path if path.parent == ROOT / "notebooks" and path.name[:2].isdigit() else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield  # nbval's setup first: it starts the notebook's kernel
    path = _main_notebook(item)
    if path is None or path in _installed:
        return
    sys.path.insert(0, str(ROOT / "scripts"))
    import build_site

    kernel = item.parent.kernel
    msg_id = kernel.execute_cell_input(build_site.SETUP, allow_stdin=False)
    kernel.await_reply(msg_id, timeout=120)  # its iopub messages carry another parent: nbval skips them
    _installed.add(path)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    yield
    path = _main_notebook(item)
    if path is None or call.when != "call":
        return
    _outputs.setdefault(path, {})[item.cell_num] = list(item.test_outputs or [])
    cells = [c for c in item.parent.nb.cells if c.cell_type == "code"]
    if item.cell is cells[-1]:
        _write(path)


def _write(path: Path) -> None:
    import nbformat

    sys.path.insert(0, str(ROOT / "scripts"))
    import build_site

    nb = nbformat.read(path, as_version=4)
    outputs = _outputs.pop(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    if len(outputs) != len(code):
        return  # a cell failed or was skipped: nbval reports it, and nothing is saved
    for cell, index in zip(code, sorted(outputs)):
        cell.outputs = [nbformat.from_dict(o) for o in outputs[index]]
    # relative to where pytest runs (make test: the repository's root)
    build_site.save_executed(Path(EXECUTED).resolve(), path.stem, nb)
