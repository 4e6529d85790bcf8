"""Build the course's website: Sphinx with MyST-NB and the book theme, every notebook executed on real ranks.

    python scripts/build_site.py --out site   # execute every notebook, then build (make site)
    python scripts/build_site.py --out site 00 01   # execute only these; the others' pages have no outputs
    python scripts/build_site.py --out site --executed DIR   # build from notebooks already executed into DIR

A notebook executes with static widgets (``shardlib/ui/static.py``): a page has no kernel, so each widget shows
what it drew for its starting value, and each figure is a ``<div>`` that the site's one ``plotly.min.js`` draws.
The pages are staged beside an ``index.md`` written here from the notebooks' headers (the two parts, the
exercises, the glossary and the cheatsheet in the navigation) and built with ``docs/conf.py``; a broken link
or a page outside the navigation fails the build. The site reads offline and has Sphinx's search.

``make test`` does not execute the notebooks a second time for the site: its nbval run installs the same
static widgets and saves each executed notebook (see ``notebooks/conftest.py``), and ``tests/static_site``
builds the site from them.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SETUP = "import shardlib.ui.static\nshardlib.ui.static.install()"
PAGES = ("glossary", "cheatsheet")  # notebooks/<name>.md, pages beside the notebooks
PART = re.compile(r"^> \*\*(Both parts|Part I+)[,.]\s*([^*]*?)\.?\*\*", re.M)


def jupyterlab_anchor(heading: str) -> str:
    """A heading's anchor as JupyterLab makes it (its text, spaces as hyphens): the links between the course's
    pages are written for JupyterLab, and lead to the same headings on the site."""
    return heading.replace(" ", "-")


def without_widget_state(nb):
    """No widget state is saved with a page: each output keeps its static fallback only."""
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            output.get("data", {}).pop(WIDGET_VIEW, None)
    nb.metadata.pop("widgets", None)
    return nb


def execute(path: Path, timeout_s: int = 600):
    """Run the notebook with static widgets; returns the executed notebook without the set-up cell."""
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(SETUP))
    NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nb.cells.pop(0)
    return without_widget_state(nb)


def save_executed(folder: Path, stem: str, nb) -> Path:
    """An executed notebook, widget state removed, as ``folder/<stem>.ipynb``."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{stem}.ipynb"
    nbformat.write(without_widget_state(nb), target)
    return target


def notebook_paths(prefixes: list[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if prefixes:
        paths = [p for p in paths if any(p.name.startswith(x) for x in prefixes)]
        if not paths:
            raise SystemExit(f"no notebook in {NOTEBOOKS} starts with {prefixes}")
    return paths


def part_of(path: Path) -> str:
    """The part a notebook's header names: "Start here" for the one both parts share."""
    found = PART.search(path.with_suffix(".py").read_text().replace("\n# ", "\n"))
    if not found:
        raise ValueError(f"{path.name}: its header names no part (> **Part I, ...** or > **Both parts.**)")
    part, subject = found.groups()
    return "Start here" if part == "Both parts" else f"{part}: {subject}"


def _toctree(caption: str, docs: list[str]) -> str:
    return "```{toctree}\n:caption: " + caption + "\n:maxdepth: 1\n\n" + "\n".join(docs) + "\n```\n"


def index_page(notebooks: list[Path], exercises: list[Path]) -> str:
    """The site's front page: the navigation, a part at a time, then the exercises and the reference pages."""
    parts: dict[str, list[str]] = {}
    for path in notebooks:
        parts.setdefault(part_of(path), []).append(path.stem)
    trees = [_toctree(caption, docs) for caption, docs in parts.items()]
    trees.append(_toctree("Exercises", [f"exercises/{p.stem}" for p in exercises]))
    trees.append(_toctree("Reference", list(PAGES)))
    return ("# The sharding notebooks\n\nHow a model too big for one GPU is served and trained across many. "
            "Every page was executed on real ranks when the site was built. To move the sliders, run the "
            "notebooks in JupyterLab (`make lab`, or the launch button at the top of each page).\n\n"
            + "\n".join(trees))


def stage(executed: Path, source: Path) -> Path:
    """Sphinx's source folder: each main notebook as executed into ``executed`` (as it is, without outputs,
    where it was not), the exercises as a learner gets them, the glossary, the cheatsheet and the front page."""
    if source.exists():
        shutil.rmtree(source)
    (source / "exercises").mkdir(parents=True)
    notebooks = notebook_paths()
    for path in notebooks:
        ran = executed / path.name
        shutil.copy(ran if ran.exists() else path, source / path.name)
    exercises = sorted((NOTEBOOKS / "exercises").glob("*.ipynb"))
    for path in exercises:
        shutil.copy(path, source / "exercises" / path.name)
    for stem in PAGES:
        shutil.copy(NOTEBOOKS / f"{stem}.md", source / f"{stem}.md")
    (source / "index.md").write_text(index_page(notebooks, exercises))
    return source


def sphinx(source: Path, out: Path) -> None:
    """Build the HTML site from ``source`` into ``out`` with ``docs/conf.py``; a warning fails the build."""
    if out.exists():
        shutil.rmtree(out)
    done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-W", "--keep-going",
                           "-c", str(ROOT / "docs"), "-d", str(source.parent / f"{source.name}.doctrees"),
                           str(source), str(out)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the site did not build (sphinx exit {done.returncode}):\n{done.stderr[-6000:]}")


def build(out: Path, prefixes: list[str] | None = None, executed: Path | None = None) -> Path:
    """Execute the notebooks (unless ``executed`` holds them already), stage them and build the site."""
    with tempfile.TemporaryDirectory() as tmp:
        if executed is None:
            executed = Path(tmp) / "executed"
            for path in notebook_paths(prefixes):
                started = time.perf_counter()
                save_executed(executed, path.stem, execute(path))
                print(f"{path.name}: executed in {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        sphinx(stage(executed, Path(tmp) / "source"), out)
        print(f"built in {time.perf_counter() - started:.1f} s", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site")
    parser.add_argument("--executed", type=Path, help="a folder of notebooks already executed (NN_name.ipynb)")
    parser.add_argument("prefixes", nargs="*", help="only notebooks whose names start with these")
    args = parser.parse_args(argv)
    build(args.out.resolve(), args.prefixes, args.executed and args.executed.resolve())
    print(f"site written to {args.out}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
