"""A student's side of the nbgrader course, in a real JupyterLab: the Assignments tab lists every assignment
`make assignments` released, Fetch puts one in assignments/, Submit hands it in, and the instructor's collect
finds it under course/submitted/.

The server serves a throwaway copy of what a clone holds for this (the repository's nbgrader_config.py,
assignments/nbgrader_config.py and the course's source notebooks, released here), so nothing is written into
the repository.
"""

from __future__ import annotations

import getpass
import importlib.util
import shutil
from pathlib import Path

from .lab_server import CHROMIUM_FLAGS, LabServer

ROOT = Path(__file__).resolve().parents[2]


def _course_script():
    spec = importlib.util.spec_from_file_location("course_script", ROOT / "scripts" / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_assignments_tab_lists_fetches_and_submits(tmp_path, chromium):
    from playwright.sync_api import sync_playwright

    course_script = _course_script()
    lab = LabServer(tmp_path, notebooks=[])
    course = lab.root / "course"
    (course / "source").mkdir(parents=True)
    shutil.copy(ROOT / "course" / "nbgrader_config.py", course)
    names = course_script.assignments(ROOT / "course")
    for name in names:
        shutil.copytree(ROOT / "course" / "source" / name, course / "source" / name)
    shutil.copy(ROOT / "nbgrader_config.py", lab.root)
    (lab.root / "assignments").mkdir()
    shutil.copy(ROOT / "assignments" / "nbgrader_config.py", lab.root / "assignments")
    with open(lab.root / "assignments" / "nbgrader_config.py", "a") as f:  # this student's own record of submissions
        f.write(f"\nc.Exchange.cache = {str(tmp_path / 'nbgrader_cache')!r}\n")
    assert course_script.release(course) == names
    name = "10_context_parallel"

    with lab, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        errors = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"http://127.0.0.1:{lab.port}/lab?reset")
        page.wait_for_function("window.jupyterapp && window.jupyterapp.commands.hasCommand("
                               "'nbgrader:open-assignment-list')", timeout=90_000)
        page.evaluate("window.jupyterapp.commands.execute('nbgrader:open-assignment-list')")
        released = page.locator("#released_assignments_list .list_item")
        released.first.wait_for(timeout=60_000)
        listed = [t.strip() for t in page.locator("#released_assignments_list .item_name").all_inner_texts()]
        assert listed == names, page.inner_text("#released_assignments_list")

        released.filter(has_text=name).get_by_role("button", name="Fetch").click()
        fetched = page.locator("#fetched_assignments_list .list_item").filter(has_text=name)
        fetched.first.wait_for(timeout=60_000)
        (notebook,) = (lab.root / "assignments" / name).glob("*.ipynb")
        assert notebook.name == f"{name}_exercises.ipynb"

        fetched.first.get_by_role("button", name="Submit").click()
        page.locator("#submitted_assignments_list .list_item").filter(has_text=name).first.wait_for(timeout=60_000)
        browser.close()
    assert not errors, errors

    api = course_script.nbgrader_api(course)
    assert api.collect(name)["success"]
    assert (course / "submitted" / getpass.getuser() / name / notebook.name).is_file()
