"""Every notebook as a learner meets it: Run All in real JupyterLab in headless Chromium, then every control.

One JupyterLab page opens the notebooks in turn, as one learner's session does (each notebook closed, its
kernel shut down, before the next opens); under pytest-xdist (``make test`` runs two workers) each worker
has its own JupyterLab and page, and takes its share of the notebooks. Per notebook: the whole notebook
runs with JupyterLab's own Run All; no cell has an error output; no widget failed to display ("Error
displaying widget", "Failed to load model class"); every plotly figure the kernel sent is drawn. Then,
after the last cell has run (as a learner would, scrolling back up), every slider, dropdown, toggle
button, checkbox and check-yourself choice is moved once, and what its widget shows (figures and text)
must change. Last, JupyterLab's log console, where a widget callback's exception goes and where no
learner looks, must hold no error.

The timing claims are not asserted here: the kernels run with ``SHARDLIB_STRICT_CLAIMS=0`` (``lab_server``),
so a claim the machine's load spoiled prints its numbers, as it would for a learner; the report lists it
(``claims_not_shown``) and the test warns. ``make test``'s nbval run asserts every one of them first, alone
on the machine; here the browser's two workers and another lane share the two cores.

Every wait polls for what it waits for (the kernel's answer to each message the page sent, a view that
changed, a figure drawn); none is a fixed sleep. Screenshots and a JSON report per notebook, with the
seconds each phase took, go to artifacts/browser/.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings
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
  let pending = false;
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i); if (c.type !== 'code') continue;
    if (c.outputs.toJSON().some(o => o.output_type === 'error')) return true;  // Run All stops there
    if (c.sharedModel.getSource().trim() && c.executionCount === null) pending = true;
  }
  return !pending; }"""

KERNEL_IDLE = """() => { const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
  return !!(s && s.kernel && s.kernel.status === 'idle'); }"""

# Every request the page sends the kernel (a widget's comm message, an execution) is pending until the
# kernel's "idle" status for it arrives: the kernel has then answered it, its outputs included.
TRACK_REQUESTS = """() => { const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
  window.__pending = new Set(); window.__quietSince = null;
  k.anyMessage.connect((_, args) => { const msg = args.msg;
    if (args.direction === 'send') { if (msg.channel === 'shell') window.__pending.add(msg.header.msg_id); }
    else if (msg.header.msg_type === 'status' && msg.content.execution_state === 'idle' && msg.parent_header)
      window.__pending.delete(msg.parent_header.msg_id);
  }); }"""

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
      claims_not_shown: [...new Set(node.innerText.match(/[^\\n]*not shown this time[^\\n]*/gi) || [])],
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

# Quiet: no request pending, the kernel idle and, where a control is named, what it drives (VIEW) unchanged,
# all without a break for QUIET_MS (a callback that sends another message, or a figure still being drawn,
# breaks it).
QUIET_MS = 60
QUIET = f"""(control) => {{ const s = window.jupyterapp.shell.currentWidget.sessionContext.session;
  const now = performance.now();
  if (window.__pending.size || !(s && s.kernel && s.kernel.status === 'idle')) {{
    window.__quietSince = null; return false; }}
  const view = control ? ({VIEW})(control) : '';
  if (view !== window.__quietView) {{ window.__quietView = view; window.__quietSince = null; }}
  if (window.__quietSince === null) window.__quietSince = now;
  return now - window.__quietSince >= {QUIET_MS}; }}"""

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

# Every plotly figure the kernel sent is drawn, and the page's widgets and figures have stopped appearing
# (the same count of widget views and drawn figures for 300 ms).
ALL_DRAWN = """() => { const panel = window.jupyterapp.shell.currentWidget; const cells = panel.content.model.cells;
  for (let i = 0; i < cells.length; i++) {
    const model = cells.get(i); if (model.type !== 'code') continue;
    const sent = model.outputs.toJSON().filter(o => o.data && o.data['application/vnd.plotly.v1+json']).length;
    const node = panel.content.widgets[i].node;
    const drawn = Array.from(node.querySelectorAll('.js-plotly-plot')).filter(d => d.querySelector('.main-svg'));
    if (drawn.length < sent) return false;
  }
  const count = panel.content.node.querySelectorAll('.jupyter-widgets, .js-plotly-plot .main-svg').length;
  const now = performance.now();
  if (window.__drawnCount !== count) { window.__drawnCount = count; window.__drawnSince = now; return false; }
  return now - window.__drawnSince >= 300; }"""
DRAW_TIMEOUT_MS = 15_000

# The log console is open and has shown the same entries for 300 ms.
LOG_SHOWN = """() => { const panel = document.querySelector('.jp-LogConsolePanel'); if (!panel) return false;
  const count = panel.querySelectorAll('.jp-OutputArea-output').length, now = performance.now();
  if (window.__logCount !== count) { window.__logCount = count; window.__logSince = now; return false; }
  return now - window.__logSince >= 300; }"""

LOG_ENTRIES = """() => Array.from(document.querySelectorAll('.jp-LogConsolePanel .jp-OutputArea-output'))
  .map(e => e.innerText)"""

OPEN_LOG = """() => window.jupyterapp.commands.execute('logconsole:open',
  {source: window.jupyterapp.shell.currentWidget.context.path, insertMode: 'split-bottom'})"""

SHUT_DOWN_KERNEL = """async () => { await window.jupyterapp.shell.currentWidget.sessionContext.shutdown(); }"""

APP_STARTED = "() => !!(window.jupyterapp && window.jupyterapp.shell)"
APP_RESTORED = "async () => { await window.jupyterapp.restored; }"

# One JupyterLab page serves every notebook, as one learner's does: each is opened in turn with
# JupyterLab's own command, and closed (its kernel shut down first, its log console closed) before the next.
OPEN_NOTEBOOK = """async (path) => { const app = window.jupyterapp;
  const widget = await app.commands.execute('docmanager:open', {path, factory: 'Notebook'});
  app.shell.activateById(widget.id); window.__drawnCount = null; }"""

CLOSE_ALL = """async () => { const app = window.jupyterapp;
  // the log console's command toggles it: close it the same way, so that the next opens a fresh one
  if (app.commands.isToggled('logconsole:open')) await app.commands.execute('logconsole:open');
  for (const w of Array.from(app.shell.widgets('main'))) {
    const session = w.sessionContext && w.sessionContext.session;
    if (session && session.kernel) await w.sessionContext.shutdown();
    if (w.context) w.context.model.dirty = false;  // nothing to save: the copies are thrown away
    w.dispose();
  } }"""


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
                               timeout=MOVE_TIMEOUT_MS, polling=50)
    except Exception:
        report["unchanged"].append({"control": control, "action": action})
        return
    _settle(page, control)  # it has changed: let the kernel finish and the figures draw, so the next starts from rest
    report["moved"].append({"control": control, "action": action})


def _settle(page, control=None) -> None:
    """Until every request the page has sent is answered, the kernel has been idle and what ``control`` drives
    has stayed the same (where one is named), for QUIET_MS."""
    page.evaluate("() => { window.__quietSince = null; window.__quietView = null; }")
    page.wait_for_function(QUIET, arg=control, timeout=MOVE_TIMEOUT_MS, polling=25)


def _push_past_the_ends(page, cell: int, k: int, report: dict) -> None:
    """Take a slider to each end and past it, by keyboard (End then ArrowRight, Home then ArrowLeft) and by
    dragging its handle beyond the track: a learner does both, and a control must be safe at either end."""
    for end_key, past_key, side in (("End", "ArrowRight", "right"), ("Home", "ArrowLeft", "left")):
        if page.evaluate(HANDLE, [cell, k]) is None:
            return
        page.keyboard.press(end_key)
        _settle(page, [cell, "slider", k])
        handle = page.evaluate(HANDLE, [cell, k])
        if handle["now"] != (handle["max"] if side == "right" else handle["min"]):
            report["ends_not_reached"].append([cell, k, end_key, handle["now"]])
        page.keyboard.press(past_key)
        _settle(page, [cell, "slider", k])
        handle = page.evaluate(HANDLE, [cell, k])
        beyond = handle[side] + (60 if side == "right" else -60)
        page.mouse.move(handle["x"], handle["y"])
        page.mouse.down()
        page.mouse.move(beyond, handle["y"], steps=8)
        page.mouse.up()
        _settle(page, [cell, "slider", k])
    report["ends_pushed"].append([cell, k])


def _run_notebook(page, lab: LabServer, name: str) -> dict:
    stem = Path(name).stem
    clock = [time.perf_counter()]
    timings_s = {}

    def lap(phase: str) -> None:  # where the test spends its time, per phase, in the report
        now = time.perf_counter()
        timings_s[phase] = round(now - clock[0], 2)
        clock[0] = now

    page.evaluate(OPEN_NOTEBOOK, name)
    page.wait_for_function(NOTEBOOK_READY, timeout=120_000, polling=100)
    page.evaluate(TRACK_REQUESTS)
    lap("open")
    page.evaluate(RUN_ALL)
    page.wait_for_function(ALL_DONE, timeout=RUN_ALL_TIMEOUT_MS, polling=100)
    lap("run_all")
    _settle(page)
    try:  # let the renderers draw what arrived last (plotly.js loads lazily the first time)
        page.wait_for_function(ALL_DRAWN, timeout=DRAW_TIMEOUT_MS, polling=100)
    except Exception:
        pass  # the report below counts what was drawn, and the test says which figures were not
    report = {"notebook": name, "cells": page.evaluate(CELL_REPORTS), "moved": [], "unchanged": [],
              "skipped_disabled": [], "log": [], "ends_pushed": [], "ends_not_reached": [],
              "timings_s": timings_s}
    lap("drawn")
    page.screenshot(path=str(ARTIFACTS / f"{stem}-after-run-all.png"), full_page=True)
    lap("screenshot")
    controls = page.evaluate(CONTROLS)
    report["controls"] = len(controls)
    for control in controls:  # after the last cell has run, top to bottom, as a learner scrolls back
        _move(page, control, stem, report)
    lap("moves")
    for cell, kind, k in controls:
        if kind == "slider":
            _push_past_the_ends(page, cell, k, report)
    lap("ends")
    page.screenshot(path=str(ARTIFACTS / f"{stem}-after-moves.png"), full_page=True)
    lap("screenshot_2")
    _settle(page)
    page.evaluate("() => { window.__logCount = null; }")
    page.evaluate(OPEN_LOG)
    page.wait_for_function(LOG_SHOWN, timeout=DRAW_TIMEOUT_MS, polling=100)
    report["log"] = page.evaluate(LOG_ENTRIES)
    lap("log")
    page.evaluate(SHUT_DOWN_KERNEL)
    lap("shutdown")
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


class LabPage:
    """The one JupyterLab page the notebooks share; a fresh one after a notebook that left it broken."""

    def __init__(self, browser, lab: LabServer) -> None:
        self.browser, self.lab, self.page = browser, lab, None

    def get(self):
        if self.page is None:
            self.page = self.browser.new_page(viewport={"width": 1400, "height": 1000})
            self.page.goto(f"http://127.0.0.1:{self.lab.port}/lab?reset")  # a clean workspace
            self.page.wait_for_function(APP_STARTED, timeout=120_000, polling=100)
            self.page.evaluate(APP_RESTORED)
        return self.page

    def close_all(self) -> None:
        try:
            self.page.evaluate(CLOSE_ALL)
        except Exception:
            self.discard()

    def discard(self) -> None:
        if self.page is not None:
            self.page.close()
            self.page = None


@pytest.fixture(scope="module")
def lab_page(lab, browser):
    shared = LabPage(browser, lab)
    yield shared
    shared.discard()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_all_then_every_control_answers(name, lab, lab_page):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = lab_page.get()
    try:
        report = _run_notebook(page, lab, name)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"{Path(name).stem}-failure.png"), full_page=True)
        lab_page.close_all()
        raise
    lab_page.close_all()
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
    not_shown = [line for c in report["cells"] for line in c["claims_not_shown"]]
    if not_shown:  # said, not failed: the nbval run asserts these claims alone on the machine
        warnings.warn(f"{name}: {len(not_shown)} timing claim(s) did not hold beside the other lane: "
                      + "; ".join(not_shown), stacklevel=1)
    assert not problems, "\n".join(problems)
    assert all(c["executed"] for c in report["cells"] if c["source"].strip()), "Run All did not reach every cell"
    assert sum(c["drawn_figures"] for c in report["cells"]) >= 1, f"{name} drew no figure at all"
    assert sum(c["code_blocks"] for c in report["cells"]) >= 1, f"{name}: its Read the code section shows no source"
    assert report["moved"], f"{name}: no control was moved (the notebook should have at least one to explore)"
