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
