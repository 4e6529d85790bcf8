"""`make site`: every notebook executed into a page that reads without a kernel.

The build runs once for the module (it executes every notebook), unless ``SHARDLIB_SITE_DIR`` names a
folder where the nbval run already wrote every page (``make test``: see ``notebooks/conftest.py``). Each page must
load the plotly.js copied beside it, carry its figures (widgets included, as still figures), keep no
widget placeholder that needs a kernel, and, where a chromium is present, draw every figure in a real
browser. The glossary and the cheatsheet are pages too, their links pointing at pages.
"""

from __future__ import annotations

import os
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
    built = Path(os.environ["SHARDLIB_SITE_DIR"]).resolve() if os.environ.get("SHARDLIB_SITE_DIR") else None
    if built and all((built / f"{n}.html").exists() for n in NOTEBOOKS):
        build_site.write_index(built)
        return built  # written by the nbval run, from the one execution of each notebook
    out = tmp_path_factory.mktemp("site")
    build_site.build(out)
    return out


@pytest.fixture(scope="module")
def browser():
    if not chromium_path():
        yield None
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_FLAGS)
        yield b
        b.close()


def test_index_links_every_notebook(site):
    index = (site / "index.html").read_text()
    assert [f"{n}.html" for n in NOTEBOOKS] == re.findall(r'href="([0-9][0-9]_[^"]+\.html)"', index)
    assert (site / "plotly.min.js").stat().st_size > 1_000_000


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_page_carries_its_figures(site, browser, stem):
    text = (site / f"{stem}.html").read_text()
    head = text[: text.index("</head>")]
    assert '<script src="plotly.min.js"></script>' in head
    assert head.index("plotly.min.js") < head.find("require") or "require" not in head
    figures = text.count("Plotly.newPlot(")
    assert figures >= 1, f"{stem}.html has no figure"
    assert "application/vnd.jupyter.widget-view+json" not in text
    assert "Read the code" in text and 'class="shardlib-code"' in text, f"{stem}.html shows no source to read"
    if browser is not None:
        page = browser.new_page()
        page.goto((site / f"{stem}.html").as_uri())
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {figures}",
                               timeout=30_000)
        drawn = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                              ".filter(d => d.querySelector('.main-svg')).length")
        page.close()
        assert drawn == figures, f"{stem}.html: {figures} figures on the page, {drawn} drawn"


@pytest.mark.parametrize("stem", build_site.PAGES)
def test_the_glossary_and_the_cheatsheet_are_pages_whose_links_lead_to_pages(site, stem):
    text = (site / f"{stem}.html").read_text()
    assert f'href="{stem}.html"' in (site / "index.html").read_text()
    links = re.findall(r'href="([^"#]+)(?:#[^"]*)?"', text)
    local = [link for link in links if not link.startswith(("http://", "https://"))]
    assert local and all(link.endswith(".html") and (site / link).exists() for link in local), local
