"""Every notebook is a jupytext pair (.py percent source + .ipynb), and the pair is in sync."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
NOT_NOTEBOOKS = {"conftest"}  # notebooks/conftest.py: the nbval plugin that saves the executed notebooks


def notebook_sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.py") if p.stem not in NOT_NOTEBOOKS)


def test_every_notebook_has_both_halves():
    py = {p.stem for p in notebook_sources(NOTEBOOKS)}
    ipynb = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert py, "no notebooks found"
    assert py == ipynb, f"unpaired: {sorted(py ^ ipynb)}"


def test_jupytext_sync_changes_nothing(tmp_path):
    """Sync a copy; if the halves disagree, jupytext rewrites one of them and the bytes differ."""
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    copy = tmp_path / "notebooks"
    shutil.copytree(NOTEBOOKS, copy, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    sources = notebook_sources(copy)
    subprocess.run([sys.executable, "-m", "jupytext", "--sync", *map(str, sources)], check=True,
                   capture_output=True, cwd=tmp_path)
    for path in sorted(copy.iterdir()):
        if path.suffix in (".py", ".ipynb") and path.stem not in NOT_NOTEBOOKS:
            assert path.read_bytes() == (NOTEBOOKS / path.name).read_bytes(), f"{path.name} is out of sync"


def test_notebooks_are_stored_without_outputs():
    import json

    for nb in NOTEBOOKS.glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code"), nb.name
