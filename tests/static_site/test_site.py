"""`make site`: every notebook executed into a page that reads without a kernel.

The build runs once for the module (it executes every notebook). Each page must load the plotly.js
copied beside it, carry its figures (widgets included, as still figures), keep no widget placeholder
that needs a kernel, and, where a chromium is present, draw every figure in a real browser.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "tests" / "browser")]
import build_site  # noqa: E402
from lab_server import CHROMIUM_FLAGS, chromium_path  # noqa: E402

NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    build_site.build(out)
    return out


def test_index_links_every_notebook(site):
    index = (site / "index.html").read_text()
    assert [f"{n}.html" for n in NOTEBOOKS] == re.findall(r'href="([^"]+\.html)"', index)
    assert (site / "plotly.min.js").stat().st_size > 1_000_000


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_page_carries_its_figures(site, stem):
    text = (site / f"{stem}.html").read_text()
    head = text[: text.index("</head>")]
    assert '<script src="plotly.min.js"></script>' in head
    assert head.index("plotly.min.js") < head.find("require") or "require" not in head
    figures = text.count("Plotly.newPlot(")
    assert figures >= 1, f"{stem}.html has no figure"
    assert "application/vnd.jupyter.widget-view+json" not in text
    assert "Read the code" in text and 'class="shardlib-code"' in text, f"{stem}.html shows no source to read"
    if chromium_path():
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
            page = browser.new_page()
            page.goto((site / f"{stem}.html").as_uri())
            page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {figures}",
                                   timeout=30_000)
            drawn = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                                  ".filter(d => d.querySelector('.main-svg')).length")
            browser.close()
        assert drawn == figures, f"{stem}.html: {figures} figures on the page, {drawn} drawn"
