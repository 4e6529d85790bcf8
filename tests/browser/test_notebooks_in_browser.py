"""Every notebook as a learner meets it: Run All in real JupyterLab in headless Chromium, then every control.

Per notebook: the whole notebook runs with JupyterLab's own Run All; no cell has an error output; no
widget failed to display ("Error displaying widget", "Failed to load model class"); every plotly figure
the kernel sent is drawn. Then, after the last cell has run (as a learner would, scrolling back up), every
slider, dropdown, toggle button, checkbox and check-yourself choice is moved once, and what its widget
shows (figures and text) must change. Last, JupyterLab's log console, where a widget callback's
exception goes and where no learner looks, must hold no error. Screenshots and a JSON report per
notebook go to artifacts/browser/.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

from .lab_server import CHROMIUM_FLAGS, REPO, LabServer

NOTEBOOKS = sorted(p.name for p in (REPO / "notebooks").glob("*.ipynb"))
ARTIFACTS = REPO / "artifacts" / "browser"
RUN_ALL_TIMEOUT_MS = 600_000
MOVE_TIMEOUT_MS = 120_000
ERROR_IN_LOG = re.compile(r"Traceback|Error|Exception")

NOTEBOOK_READY = """() => { const nb = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = nb && nb.sessionContext && nb.sessionContext.session && nb.sessionContext.session.kernel;
  return !!(k && k.status === 'idle' && nb.content && nb.content.widgets.length); }"""

RUN_ALL = "() => { void window.jupyterapp.commands.execute('notebook:run-all-cells'); }"

ALL_DONE = """() => { const panel = window.jupyterapp.shell.currentWidget; const cells = panel.content.model.cells;
  const session = panel.sessionContext.session;
  if (!(session && session.kernel && session.kernel.status === 'idle')) return false;
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type === 'code' && c.sharedModel.getSource().trim() && c.executionCount === null) return false;
  }
  return true; }"""

KERNEL_IDLE = """() => { const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
  return !!(s && s.kernel && s.kernel.status === 'idle'); }"""

CELL_REPORTS = """() => { const panel = window.jupyterapp.shell.currentWidget; const out = [];
  const cells = panel.content.model.cells;
  for (let i = 0; i < cells.length; i++) {
    const model = cells.get(i); if (model.type !== 'code') continue;
    const node = panel.content.widgets[i].node; const outputs = model.outputs.toJSON();
    out.push({
      index: i, source: model.sharedModel.getSource().slice(0, 80), executed: model.executionCount !== null,
      errors: outputs.filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
      plotly_outputs: outputs.filter(o => o.data && o.data['application/vnd.plotly.v1+json']).length,
      drawn_figures: Array.from(node.querySelectorAll('.js-plotly-plot'))
        .filter(d => d.querySelector('.main-svg')).length,
      code_blocks: node.querySelectorAll('.shardlib-code').length,
      widget_failures: (node.innerText.match(/Error displaying widget|Failed to load model class/g) || []),
    });
  }
  return out; }"""

# Every control a learner can move, in every cell's outputs: [cell index, kind, position among its kind].
CONTROLS = """() => { const panel = window.jupyterapp.shell.currentWidget; const found = [];
  const kinds = {slider: '.noUi-handle', dropdown: '.widget-dropdown select',
    toggle: '.widget-toggle-buttons', checkbox: '.widget-checkbox input[type=checkbox]',
    choice: '.widget-radio-box'};
  panel.content.widgets.forEach((cell, i) => {
    const area = cell.node.querySelector('.jp-OutputArea'); if (!area) return;
    for (const [kind, selector] of Object.entries(kinds)) {
      area.querySelectorAll(selector).forEach((el, k) => found.push([i, kind, k]));
    }
  });
  return found; }"""

# What a control drives: the figures and text of the output it sits in.
VIEW = """([i, kind, k]) => { const node = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
  const marks = [];
  node.querySelectorAll('.js-plotly-plot').forEach(plot => plot.querySelectorAll('path, text').forEach(
    e => marks.push((e.getAttribute('d') || '') + e.textContent)));
  node.querySelectorAll('.widget-html-content, .jp-OutputArea-output pre').forEach(e => marks.push(e.innerText));
  return marks.join('|'); }"""

# Move control k of its kind in cell i once; return a description, or null when it cannot move (disabled).
MOVE = """([i, kind, k]) => { const node = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
  const area = node.querySelector('.jp-OutputArea');
  if (kind === 'slider') {
    const h = area.querySelectorAll('.noUi-handle')[k];
    if (h.closest('[disabled]') || h.getAttribute('aria-disabled') === 'true') return null;
    const now = Number(h.getAttribute('aria-valuenow')), top = Number(h.getAttribute('aria-valuemax'));
    h.scrollIntoView({block: 'center'}); h.focus();
    return now >= top ? 'ArrowLeft' : 'ArrowRight';
  }
  if (kind === 'dropdown') {
    const s = area.querySelectorAll('.widget-dropdown select')[k]; if (s.disabled) return null;
    const next = (s.selectedIndex + 1) % s.options.length; s.selectedIndex = next;
    s.dispatchEvent(new Event('change', {bubbles: true})); return 'option ' + s.options[next].text;
  }
  if (kind === 'toggle') {
    const buttons = Array.from(area.querySelectorAll('.widget-toggle-buttons')[k].querySelectorAll('button'));
    const other = buttons.find(b => !b.classList.contains('mod-active') && !b.disabled); if (!other) return null;
    other.click(); return 'button ' + other.innerText;
  }
  if (kind === 'checkbox') {
    const c = area.querySelectorAll('.widget-checkbox input[type=checkbox]')[k]; if (c.disabled) return null;
    c.click(); return 'checkbox';
  }
  const first = area.querySelectorAll('.widget-radio-box')[k].querySelector('input[type=radio]');
  if (!first || first.disabled) return null;
  first.click(); return 'choice';
}"""

# The k-th slider handle of cell i, focused and in view: its value, range and where to grab it.
HANDLE = """([i, k]) => { const node = window.jupyterapp.shell.currentWidget.content.widgets[i].node;
  const h = node.querySelector('.jp-OutputArea').querySelectorAll('.noUi-handle')[k];
  if (h.closest('[disabled]') || h.getAttribute('aria-disabled') === 'true') return null;
  h.scrollIntoView({block: 'center'}); h.focus();
  const box = h.getBoundingClientRect(), track = h.closest('.noUi-target').getBoundingClientRect();
  return {now: Number(h.getAttribute('aria-valuenow')), min: Number(h.getAttribute('aria-valuemin')),
          max: Number(h.getAttribute('aria-valuemax')), x: box.x + box.width / 2, y: box.y + box.height / 2,
          left: track.x, right: track.x + track.width}; }"""

LOG_ENTRIES = """() => Array.from(document.querySelectorAll('.jp-LogConsolePanel .jp-OutputArea-output'))
  .map(e => e.innerText)"""

OPEN_LOG = """() => window.jupyterapp.commands.execute('logconsole:open',
  {source: window.jupyterapp.shell.currentWidget.context.path, insertMode: 'split-bottom'})"""

SHUT_DOWN_KERNEL = """async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }"""


def _move(page, control, stem: str, report: dict) -> None:
    """Move one control and wait until what it drives has changed and the kernel is idle again."""
    before = page.evaluate(VIEW, control)
    action = page.evaluate(MOVE, control)
    if action is None:
        report["skipped_disabled"].append(control)
        return
    if action.startswith("Arrow"):
        page.keyboard.press(action)
    try:
        page.wait_for_function(f"(c) => ({VIEW})(c) !== {json.dumps(before)}", arg=control,
                               timeout=MOVE_TIMEOUT_MS, polling=250)
    except Exception:
        report["unchanged"].append({"control": control, "action": action})
        return
    page.wait_for_function(KERNEL_IDLE, timeout=MOVE_TIMEOUT_MS, polling=250)
    page.wait_for_timeout(200)
    report["moved"].append({"control": control, "action": action})


def _settle(page) -> None:
    page.wait_for_timeout(300)
    page.wait_for_function(KERNEL_IDLE, timeout=MOVE_TIMEOUT_MS, polling=250)


def _push_past_the_ends(page, cell: int, k: int, report: dict) -> None:
    """Take a slider to each end and past it, by keyboard (End then ArrowRight, Home then ArrowLeft) and by
    dragging its handle beyond the track: a learner does both, and a control must be safe at either end."""
    for end_key, past_key, side in (("End", "ArrowRight", "right"), ("Home", "ArrowLeft", "left")):
        if page.evaluate(HANDLE, [cell, k]) is None:
            return
        page.keyboard.press(end_key)
        _settle(page)
        handle = page.evaluate(HANDLE, [cell, k])
        if handle["now"] != (handle["max"] if side == "right" else handle["min"]):
            report["ends_not_reached"].append([cell, k, end_key, handle["now"]])
        page.keyboard.press(past_key)
        _settle(page)
        handle = page.evaluate(HANDLE, [cell, k])
        beyond = handle[side] + (60 if side == "right" else -60)
        page.mouse.move(handle["x"], handle["y"])
        page.mouse.down()
        page.mouse.move(beyond, handle["y"], steps=8)
        page.mouse.up()
        _settle(page)
    report["ends_pushed"].append([cell, k])


def _run_notebook(page, lab: LabServer, name: str) -> dict:
    stem = Path(name).stem
    page.goto(lab.url(name))
    page.wait_for_function(NOTEBOOK_READY, timeout=120_000, polling=250)
    page.evaluate(RUN_ALL)
    page.wait_for_function(ALL_DONE, timeout=RUN_ALL_TIMEOUT_MS, polling=500)
    page.wait_for_timeout(1000)  # let the renderers draw what arrived last
    report = {"notebook": name, "cells": page.evaluate(CELL_REPORTS), "moved": [], "unchanged": [],
              "skipped_disabled": [], "log": [], "ends_pushed": [], "ends_not_reached": []}
    if any(c["plotly_outputs"] > c["drawn_figures"] for c in report["cells"]):
        page.wait_for_timeout(3000)  # plotly.js loads lazily the first time
        report["cells"] = page.evaluate(CELL_REPORTS)
    page.screenshot(path=str(ARTIFACTS / f"{stem}-after-run-all.png"), full_page=True)
    controls = page.evaluate(CONTROLS)
    report["controls"] = len(controls)
    for control in controls:  # after the last cell has run, top to bottom, as a learner scrolls back
        _move(page, control, stem, report)
    for cell, kind, k in controls:
        if kind == "slider":
            _push_past_the_ends(page, cell, k, report)
    page.screenshot(path=str(ARTIFACTS / f"{stem}-after-moves.png"), full_page=True)
    page.evaluate(OPEN_LOG)
    page.wait_for_timeout(1500)
    report["log"] = page.evaluate(LOG_ENTRIES)
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
def test_notebook_runs_all_then_every_control_answers(name, lab, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        report = _run_notebook(page, lab, name)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-failure.png"), full_page=True)
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
            problems.append(f"{where}: {cell['plotly_outputs']} plotly figure(s) sent, {cell['drawn_figures']} drawn")
    problems += [f"cell {c['control'][0]}: moving {c['control'][1]} {c['control'][2]} ({c['action']}) changed nothing "
                 "it drives" for c in report["unchanged"]]
    problems += [f"log console: {entry}" for entry in report["log"] if ERROR_IN_LOG.search(entry)]
    problems += [f"cell {c}: slider {k} did not reach its end with {key} (stopped at {now})"
                 for c, k, key, now in report["ends_not_reached"]]
    assert not problems, "\n".join(problems)
    assert all(c["executed"] for c in report["cells"] if c["source"].strip()), "Run All did not reach every cell"
    assert sum(c["drawn_figures"] for c in report["cells"]) >= 1, f"{name} drew no figure at all"
    assert sum(c["code_blocks"] for c in report["cells"]) >= 1, f"{name}: its Read the code section shows no source"
    assert report["moved"], f"{name}: no control was moved (the notebook should have at least one to explore)"
