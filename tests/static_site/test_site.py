"""`make site`: the course's website (Sphinx, MyST-NB, the book theme), every notebook executed on real ranks.

The site is built once for the module. Under ``make test`` it is built from the notebooks the nbval run
executed (``SHARDLIB_EXECUTED_DIR``, see ``notebooks/conftest.py``) into ``SHARDLIB_SITE_DIR``; run alone, it
executes every notebook first. The navigation holds both parts, the exercises and the reference pages; each
page loads the site's plotly.js before its figures, carries every figure (widgets as still figures), shows the
source to read and a Binder button, and, where a chromium is present, draws every figure with nothing in the
console; the search finds a term offline; a link to a heading that does not exist fails the build.
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
EXERCISES = sorted(p.stem for p in (ROOT / "notebooks" / "exercises").glob("*.ipynb"))
CAPTIONS = ["Start here", "Part I: serving a model that does not fit", "Part II: training at scale", "Exercises",
            "Reference"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    executed = Path(os.environ.get("SHARDLIB_EXECUTED_DIR", tmp_path_factory.mktemp("none"))).resolve()
    out = Path(os.environ.get("SHARDLIB_SITE_DIR") or tmp_path_factory.mktemp("site")).resolve()
    if all((executed / f"{n}.ipynb").exists() for n in NOTEBOOKS):
        return build_site.build(out, executed=executed)  # the nbval run's one execution of each notebook
    return build_site.build(out)


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


def open_page(browser, path: Path, errors: list):
    page = browser.new_page()
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    return page


def test_the_navigation_holds_both_parts_the_exercises_and_the_reference_pages(site):
    index = (site / "index.html").read_text()
    assert re.findall(r'caption-text">([^<]+)<', index)[:len(CAPTIONS)] == CAPTIONS
    pages = re.findall(r'class="reference internal" href="([^"#]+)\.html"', index)
    assert pages[:len(NOTEBOOKS)] == NOTEBOOKS
    assert [f"exercises/{e}" for e in EXERCISES] + list(build_site.PAGES) == [
        p for p in pages if p.startswith("exercises/") or p in build_site.PAGES][:len(EXERCISES) + 2]
    second = (site / f"{NOTEBOOKS[1]}.html").read_text()  # each page: the navigation, and its neighbours
    assert f'href="{NOTEBOOKS[0]}.html"' in second and "<link rel=\"next\" title=" in second
    assert re.search(rf'<link rel="next"[^>]*href="{NOTEBOOKS[2]}.html"', second)


@pytest.mark.parametrize("stem", NOTEBOOKS)
def test_page_carries_its_figures(site, browser, stem):
    text = (site / f"{stem}.html").read_text()
    head = text[: text.index("</head>")]
    assert '<script src="_static/plotly.min.js"></script>' in head
    assert (site / "_static" / "plotly.min.js").stat().st_size > 1_000_000
    figures = text.count("Plotly.newPlot(")
    assert figures >= 1, f"{stem}.html has no figure"
    assert "application/vnd.jupyter.widget-view+json" not in text
    assert "Read the code" in text and 'class="shardlib-code"' in text, f"{stem}.html shows no source to read"
    assert "https://mybinder.org/v2/gh/" in text and f"urlpath=lab/tree/notebooks/{stem}.ipynb" in text
    if browser is not None:
        errors = []
        page = open_page(browser, site / f"{stem}.html", errors)
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length >= {figures}",
                               timeout=30_000)
        drawn = page.evaluate("Array.from(document.querySelectorAll('.js-plotly-plot'))"
                              ".filter(d => d.querySelector('.main-svg')).length")
        page.close()
        assert drawn == figures, f"{stem}.html: {figures} figures on the page, {drawn} drawn"
        assert not errors, f"{stem}.html: the console says {errors}"


@pytest.mark.parametrize("stem", build_site.PAGES)
def test_the_glossary_and_the_cheatsheet_link_to_headings_that_exist(site, stem):
    text = (site / f"{stem}.html").read_text()
    main = text[text.index('<main'):text.index('</main>')]
    links = re.findall(r'class="reference internal" href="([^"#]+\.html)(#[^"]*)?"', main)
    assert len(links) > 10
    for page, anchor in links:
        target = (site / page).read_text()
        assert not anchor or f'id="{anchor[1:]}"' in target, f"{stem}: {page}{anchor} leads nowhere"


def test_the_search_finds_a_term_offline(site, browser):
    assert "all-reduce" in (site / "searchindex.js").read_text().lower()
    if browser is None:
        pytest.skip("no chromium: the search index is there, the search page is not driven")
    errors = []
    page = open_page(browser, site / "search.html", errors)
    page.goto((site / "search.html").as_uri() + "?q=all-reduce")
    page.wait_for_function("document.querySelectorAll('#search-results li').length > 0", timeout=30_000)
    found = page.evaluate("Array.from(document.querySelectorAll('#search-results li a')).map(a => a.href)")
    page.close()
    assert any(f"{NOTEBOOKS[0]}.html" in href for href in found), found


def test_a_link_to_a_heading_that_does_not_exist_fails_the_build(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    (source / "index.md").write_text("# Home\n\n```{toctree}\nother\n```\n\n[there](other.md#No-such-heading)\n")
    (source / "other.md").write_text("# Other\n\n## A heading\n")
    with pytest.raises(RuntimeError, match="No-such-heading"):
        build_site.sphinx(source, tmp_path / "out")
    (source / "index.md").write_text("# Home\n\n```{toctree}\nother\n```\n\n[there](other.md#A-heading)\n")
    build_site.sphinx(source, tmp_path / "out")
    assert 'href="other.html#a-heading"' in (tmp_path / "out" / "index.html").read_text()
