"""Every link between the course's pages leads somewhere: a notebook, the glossary or the cheatsheet that
exists, and, where the link names a section, a heading of that notebook (JupyterLab's anchor: the
heading's text with its spaces as hyphens)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
LINK = re.compile(r"\]\(((?:\.\./)?(?:exercises/)?[0-9A-Za-z_]+\.(?:ipynb|md))(#[^)\s]*)?\)")
SOURCES = sorted([*NOTEBOOKS.glob("[0-9][0-9]_*.py"), *NOTEBOOKS.glob("exercises/*.py"), *NOTEBOOKS.glob("*.md")])


def anchors(target: Path) -> set[str]:
    """The anchors of a notebook's (or markdown page's) headings."""
    source = target.with_suffix(".py") if target.suffix == ".ipynb" else target
    text = source.read_text()
    prefix = "# " if source.suffix == ".py" else ""
    heads = re.findall(rf"^{re.escape(prefix)}#+\s+(.+?)\s*$", text, re.M)
    return {"#" + h.replace(" ", "-") for h in heads}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_link_between_pages_resolves(source):
    broken = []
    for target, anchor in LINK.findall(source.read_text()):
        path = (source.parent / target).resolve()
        if not path.exists():
            broken.append(f"{target}: no such page")
        elif anchor and anchor not in anchors(path):
            broken.append(f"{target}{anchor}: no heading with that anchor in {path.name}")
    assert not broken, f"{source.relative_to(ROOT)}: " + "; ".join(broken)


def test_notebook_00_maps_the_course_and_every_notebook_points_onward():
    """00's course map links every main notebook; every notebook but the last links the next one, and every
    notebook with an exercise links it."""
    mains = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py"))
    start = (NOTEBOOKS / "00_start_here.py").read_text()
    assert all(f"]({p.stem}.ipynb)" in start for p in mains[1:]), "00's map misses a notebook"
    for this, following in zip(mains, mains[1:]):
        assert f"{following.stem}.ipynb" in this.read_text().split("## What you saw")[-1], f"{this.name}: no Next"
    for exercise in sorted((NOTEBOOKS / "exercises").glob("*_exercises.py")):
        main = NOTEBOOKS / exercise.name.replace("_exercises", "")
        assert f"exercises/{exercise.stem}.ipynb" in main.read_text(), f"{main.name} never links its exercise"
