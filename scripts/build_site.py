"""Build the course as static HTML: every notebook executed, figures embedded, widgets as still figures.

    python scripts/build_site.py --out site            # all notebooks (what `make site` runs)
    python scripts/build_site.py --out site 00 01      # only the notebooks whose names start so

Each page loads ``plotly.min.js`` from beside it (copied from the installed plotly), so the site reads
offline. Widgets are shown as they were first drawn (see ``shardlib/ui/static.py``); check-yourself
questions appear as a list with each answer folded. The glossary and the cheatsheet (``notebooks/*.md``)
become pages beside the notebooks.

``make test`` does not execute the notebooks a second time for the site: its nbval run installs the same
static widgets and hands each executed notebook to ``write_page`` (see ``notebooks/conftest.py``).
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import sys
import time
from pathlib import Path

import nbformat
import plotly
from nbclient import NotebookClient
from nbconvert import HTMLExporter

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SETUP = "import shardlib.ui.static\nshardlib.ui.static.install()"


def title_of(nb) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#\s+(.+)$", cell.source, re.M)
            if m:
                return m.group(1).strip()
    return "notebook"


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


def page(nb, stem: str, nav: str) -> str:
    body, _ = HTMLExporter(template_name="lab").from_notebook_node(nb)
    # plotly.js first in <head>, before any AMD loader, so that it defines window.Plotly.
    body = body.replace("<head>", '<head>\n<script src="plotly.min.js"></script>', 1)
    return body.replace("<body", f"<body data-notebook=\"{stem}\"", 1).replace(
        "</body>", f"{nav}</body>", 1)


NAV = '<p style="margin:2em"><a href="index.html">&larr; all notebooks</a></p>'
PAGES = ("glossary", "cheatsheet")  # notebooks/<name>.md, rendered beside the notebooks


def notebook_paths(prefixes: list[str] | None = None) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if prefixes:
        paths = [p for p in paths if any(p.name.startswith(x) for x in prefixes)]
        if not paths:
            raise SystemExit(f"no notebook in {NOTEBOOKS} starts with {prefixes}")
    return paths


def markdown_page(stem: str) -> str:
    """A markdown page (the glossary, the cheatsheet) as HTML, its notebook links pointing at the pages."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune as markdown2html

    text = (NOTEBOOKS / f"{stem}.md").read_text()
    text = re.sub(r"\(([0-9][0-9]_[a-z_]+|glossary|cheatsheet)\.(?:ipynb|md)(#[^)]*)?\)", r"(\1.html\2)", text)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>" + html.escape(stem) + "</title></head>"
            "<body style='font-family:sans-serif;max-width:50em;margin:2em auto'>"
            + markdown2html(text) + NAV + "</body></html>")


def write_page(out: Path, stem: str, nb) -> Path:
    """One executed notebook (static widgets, widget state removed) as ``out/<stem>.html``."""
    target = out / f"{stem}.html"
    target.write_text(page(without_widget_state(nb), stem, NAV), encoding="utf-8")
    return target


def write_index(out: Path) -> None:
    """plotly.js, the glossary and cheatsheet pages, and an index of every notebook page found in ``out``."""
    shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", out / "plotly.min.js")
    entries = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        if (out / f"{path.stem}.html").exists():
            entries.append((f"{path.stem}.html", title_of(nbformat.read(path, as_version=4))))
    items = "".join(f'<li><a href="{name}">{html.escape(title)}</a></li>' for name, title in entries)
    pages = []
    for stem in PAGES:
        if (NOTEBOOKS / f"{stem}.md").exists():
            (out / f"{stem}.html").write_text(markdown_page(stem), encoding="utf-8")
            pages.append(f'<a href="{stem}.html">{stem.capitalize()}</a>')
    (out / "index.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>The sharding notebooks</title></head>"
        "<body style='font-family:sans-serif;max-width:50em;margin:2em auto'>"
        "<h1>The sharding notebooks</h1><p>Each page was executed on real ranks when the site was built; "
        "run them in JupyterLab (<code>make lab</code>) to move the sliders.</p>"
        f"<ol>{items}</ol><p>{' · '.join(pages)}</p></body></html>", encoding="utf-8")


def build(out: Path, prefixes: list[str] | None = None) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebook_paths(prefixes):
        started = time.perf_counter()
        target = write_page(out, path.stem, execute(path))
        written.append(target)
        print(f"{target.relative_to(out.parent) if out.parent in target.parents else target}: "
              f"{time.perf_counter() - started:.1f} s", flush=True)
    write_index(out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "site")
    parser.add_argument("prefixes", nargs="*", help="only notebooks whose names start with these")
    args = parser.parse_args(argv)
    build(args.out.resolve(), args.prefixes)
    print(f"site written to {args.out}/index.html")
    return 0


if __name__ == "__main__":
    sys.exit(main())
