"""``show_code`` shows the library's own lines, with their path and numbers, and every main notebook reads
its mechanism in a "Read the code" section."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from shardlib.lab import measure
from shardlib.lab.measure import SavedBytes, tensor_bytes
from shardlib.ui.code import show_code, source_lines

ROOT = Path(__file__).resolve().parents[2]
MAIN_NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))


def test_the_lines_shown_are_the_lines_on_disk():
    block = source_lines(tensor_bytes)
    assert block.path == "shardlib/lab/measure.py"
    on_disk = (ROOT / block.path).read_text().splitlines()
    assert list(block.lines) == on_disk[block.first - 1:block.last]
    assert block.lines[0].startswith("def tensor_bytes(")


def test_text_form_numbers_every_line_and_names_each_block():
    code = show_code(tensor_bytes, SavedBytes)
    text = repr(code)
    first, second = source_lines(tensor_bytes), source_lines(SavedBytes)
    assert text.startswith(f"# {first.title}\n")
    assert f"# {second.title}" in text
    assert code.n_lines == len(first.lines) + len(second.lines)
    numbers = [int(m) for m in re.findall(r"^\s*(\d+)  ", text, flags=re.M)]
    assert numbers[: len(first.lines)] == list(range(first.first, first.last + 1))


def test_html_form_is_highlighted_with_line_numbers():
    html = show_code(measure)._repr_html_()
    assert 'class="shardlib-code"' in html and "shardlib/lab/measure.py, lines 1-" in html
    assert "linenos" in html


def test_bad_input_says_what_it_takes():
    with pytest.raises(ValueError, match="at least one"):
        show_code()
    with pytest.raises(TypeError, match="functions, classes or modules, got int"):
        show_code(3)


@pytest.mark.parametrize("path", MAIN_NOTEBOOKS, ids=lambda p: p.stem)
def test_every_main_notebook_reads_its_code(path):
    text = path.read_text()
    heading = re.search(r"^# ## Read the code\s*$", text, flags=re.M)
    assert heading, f"{path.name} has no '## Read the code' section"
    section = text[heading.end():]
    next_heading = re.search(r"^# ## ", section, flags=re.M)
    section = section[: next_heading.start()] if next_heading else section
    assert "show_code(" in section, f"{path.name}: its Read the code section shows no source"


def _shown_modules(text: str) -> dict[str, str]:
    """Each name a notebook passes to ``show_code`` (``Class.method`` by its class), with the module it was
    imported from."""
    tree = ast.parse(text)
    imported = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    shown = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "show_code":
            for arg in node.args:
                while isinstance(arg, ast.Attribute):
                    arg = arg.value
                shown[arg.id] = imported.get(arg.id, "(defined in the notebook)")
    return shown


@pytest.mark.parametrize("path", MAIN_NOTEBOOKS, ids=lambda p: p.stem)
def test_what_a_notebook_reads_comes_from_the_core(path):
    shown = _shown_modules(path.read_text())
    assert shown, f"{path.name} shows no code"
    outside = {name: module for name, module in shown.items() if not module.startswith("shardlib.core")}
    assert outside == {}, f"{path.name} reads code from outside shardlib.core"
