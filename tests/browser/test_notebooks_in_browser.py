"""Every notebook, run cell by cell in real JupyterLab in headless Chromium.

Checks, per notebook: no cell has an error output; no widget failed to display ("Error displaying
widget", "Failed to load model class"); every plotly figure the kernel sent is drawn (an SVG on the
page); and each slider that sits beside a figure, dragged on the page, changes that figure. Screenshots
go to artifacts/browser/ for a person to look at.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .lab_server import CHROMIUM_FLAGS, REPO, LabServer

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
ARTIFACTS = REPO / "artifacts" / "browser"
CELL_TIMEOUT_MS = 300_000

NOTEBOOK_READY = """() => { const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!(k && k.status === 'idle' && nb.content && nb.content.widgets.length); }"""

CODE_CELLS = """() => { const cells = window.jupyterapp.shell.currentWidget.content.model.cells; const out = [];
  for (let i = 0; i < cells.length; i++) if (cells.get(i).type === 'code') out.push(i); return out; }"""

RUN_CELL = """(i) => { const panel = window.jupyterapp.shell.currentWidget;
  panel.content.activeCellIndex = i; panel.content.deselectAll();
  void window.jupyterapp.commands.execute('notebook:run-cell'); }"""

MARK_CELL = """(i) => { document.querySelectorAll('[data-browser-test]').forEach(e => e.removeAttribute('data-browser-test'));
  window.jupyterapp.shell.currentWidget.content.widgets[i].node.setAttribute('data-browser-test', 'current'); }"""

SHUT_DOWN_KERNEL = """async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }"""

CELL_DONE = """(i) => { const panel = window.jupyterapp.shell.currentWidget;
  const cell = panel.content.model.cells.get(i); const session = panel.sessionContext.session;
  return !!(session && session.kernel && session.kernel.status === 'idle' && cell.executionCount !== null); }"""

CELL_REPORT = """(i) => { const panel = window.jupyterapp.shell.currentWidget;
  const model = panel.content.model.cells.get(i); const node = panel.content.widgets[i].node;
  const outputs = model.outputs.toJSON();
  return {
    errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
    plotly_outputs: outputs.filter(o => o.data && o.data['application/vnd.plotly.v1+json']).length,
    drawn_figures: node.querySelectorAll('.js-plotly-plot .main-svg').length > 0 ?
      Array.from(node.querySelectorAll('.js-plotly-plot')).filter(d => d.querySelector('.main-svg')).length : 0,
    widget_failures: (node.innerText.match(/Error displaying widget|Failed to load model class/g) || []),
    sliders: node.querySelectorAll('.noUi-handle').length,
    source: model.sharedModel.getSource().slice(0, 80),
  }; }"""

# What a slider drives: the figures and text of the widget it belongs to (its own readout left out).
SLIDER_VIEW = """(i) => { const node = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
  const handle = node.querySelector('.noUi-handle'); if (!handle) return null;
  let root = handle.closest('.jp-OutputArea-output') || node;
  const marks = [];
  root.querySelectorAll('.js-plotly-plot').forEach(plot => plot.querySelectorAll('path, text').forEach(
    e => marks.push((e.getAttribute('d') || '') + e.textContent)));
  root.querySelectorAll('.widget-html-content').forEach(e => marks.push(e.innerText));
  return marks.join('|'); }"""


def _run_notebook(page, lab: LabServer, name: str) -> dict:
    page.goto(lab.url(name))
    page.wait_for_function(NOTEBOOK_READY, timeout=120_000, polling=250)
    code_cells = page.evaluate(CODE_CELLS)
    report = {"notebook": name, "cells": [], "sliders_moved": 0}
    stem = Path(name).stem
    for i in code_cells:
        page.evaluate(RUN_CELL, i)
        page.wait_for_function(CELL_DONE, arg=i, timeout=CELL_TIMEOUT_MS, polling=250)
        page.wait_for_timeout(300)                    # let the renderers draw what just arrived
        cell = page.evaluate(CELL_REPORT, i)
        if cell["plotly_outputs"] > cell["drawn_figures"]:
            page.wait_for_timeout(3000)               # plotly.js loads lazily the first time
            cell = page.evaluate(CELL_REPORT, i)
        cell["index"] = i
        report["cells"].append(cell)
        if cell["sliders"] and not cell["errors"]:
            before = page.evaluate(SLIDER_VIEW, i)
            if before:
                page.evaluate(MARK_CELL, i)
                handle = page.locator("[data-browser-test=current] .noUi-handle").first
                handle.scroll_into_view_if_needed()
                page.screenshot(path=str(ARTIFACTS / f"{stem}-cell{i}-slider-before.png"))
                box = handle.bounding_box()
                page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
                page.mouse.down()
                page.mouse.move(box["x"] + box["width"] / 2 + 60, box["y"] + box["height"] / 2, steps=5)
                page.mouse.up()
                page.wait_for_function(
                    f"(i) => ({SLIDER_VIEW})(i) !== {json.dumps(before)}", arg=i,
                    timeout=CELL_TIMEOUT_MS, polling=250,
                )
                page.wait_for_function(CELL_DONE, arg=i, timeout=CELL_TIMEOUT_MS, polling=250)
                page.screenshot(path=str(ARTIFACTS / f"{stem}-cell{i}-slider-after.png"))
                report["sliders_moved"] += 1
    page.screenshot(path=str(ARTIFACTS / f"{stem}-end.png"))
    page.evaluate(SHUT_DOWN_KERNEL)
    return report


@pytest.fixture(scope="module")
def lab(tmp_path_factory, chromium):
    # SHARDLIB_LAB_PYTHON: run JupyterLab (and so the kernel) from another environment, such as the
    # rehearsal of Binder's (scripts/binder_check.py).
    python = os.environ.get("SHARDLIB_LAB_PYTHON", sys.executable)
    with LabServer(tmp_path_factory.mktemp("lab"), python=python) as server:
        yield server


@pytest.fixture(scope="module")
def browser(chromium):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS, headless=True)
        yield b
        b.close()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_and_draws_in_the_browser(name, lab, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        report = _run_notebook(page, lab, name)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-failure.png"))
        raise
    finally:
        page.close()
    (ARTIFACTS / f"{Path(name).stem}-report.json").write_text(json.dumps(report, indent=1))
    problems = []
    for cell in report["cells"]:
        where = f"cell {cell['index']} ({cell['source']!r})"
        problems += [f"{where}: {e}" for e in cell["errors"]]
        problems += [f"{where}: {w}" for w in cell["widget_failures"]]
        if cell["drawn_figures"] < cell["plotly_outputs"]:
            problems.append(f"{where}: {cell['plotly_outputs']} plotly figure(s) sent, "
                            f"{cell['drawn_figures']} drawn")
    assert not problems, "\n".join(problems)
    assert sum(c["drawn_figures"] for c in report["cells"]) >= 1, f"{name} drew no figure at all"
    slider_cells = sum(1 for c in report["cells"] if c["sliders"])
    assert report["sliders_moved"] == slider_cells, (
        f"{name}: {slider_cells} cell(s) with a slider, {report['sliders_moved']} moved and seen to change "
        "what they drive")
