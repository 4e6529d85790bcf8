"""The package keeps its own vocabulary: every module is on the README's map and in its package's
docstring, pool drivers are ``run_*`` and return frozen dataclasses, rank functions end in ``_on_rank``."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "shardlib"


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" and "__pycache__" not in p.parts)


def readme_map() -> set[str]:
    """Paths of the modules the README's layout block names (``shardlib/pipeline/engine.py``); a folder's
    entries are indented two more spaces than the folder."""
    text = (ROOT / "README.md").read_text()
    block = text[text.index("## Layout"):]
    block = block[block.index("```") + 3:]
    block = block[:block.index("```")]
    found, folders = set(), []  # folders: (indent, path) of the folders the current line sits in
    for line in block.splitlines():
        m = re.match(r"^(\s*)([\w/.]+)", line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        folders = [(i, f) for i, f in folders if i < indent]
        if name == "shardlib/" and indent == 0:
            folders = [(0, "shardlib")]
        elif not folders or folders[0][1] != "shardlib":
            folders = []
        elif name.endswith("/"):
            folders.append((indent, f"{folders[-1][1]}/{name.rstrip('/')}"))
        elif name.endswith(".py") and indent == folders[-1][0] + 2:
            found.add(f"{folders[-1][1]}/{name}")
    return found


def dotted(path: Path) -> str:
    """``shardlib/serving/engine/blocks.py`` -> ``shardlib.serving.engine.blocks``."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_module_is_on_the_readme_map():
    listed = readme_map()
    missing = [p.relative_to(ROOT).as_posix() for p in modules() if p.relative_to(ROOT).as_posix() not in listed]
    assert missing == [], "add these to the README's layout block"
    stale = sorted(p for p in listed if not (ROOT / p).exists())
    assert stale == [], "the README's layout names modules that do not exist"


def test_every_module_is_named_in_its_package_docstring():
    missing = []
    for path in modules():
        if path.parent == PACKAGE:
            continue
        package = dotted(path).rpartition(".")[0]
        doc = importlib.import_module(package).__doc__ or ""
        if f"``{path.stem}``" not in doc:
            missing.append(f"{package}: ``{path.stem}``")
    assert missing == []


def _functions(module_name: str):
    module = importlib.import_module(module_name)
    for name, fn in vars(module).items():
        if inspect.isfunction(fn) and fn.__module__ == module_name and not name.startswith("_"):
            yield name, fn


def _driver_modules() -> list[str]:
    return [dotted(p) for p in modules() if p.stem == "drivers" or p.stem.endswith("_drivers")]


@pytest.mark.parametrize("module_name", _driver_modules())
def test_pool_drivers_are_run_star_and_return_frozen_dataclasses(module_name):
    wrong = []
    for name, fn in _functions(module_name):
        params = list(inspect.signature(fn).parameters)
        takes_pool = bool(params) and params[0] in ("ranks", "pool")
        if takes_pool != name.startswith("run_"):
            wrong.append(f"{name}: a function that takes a pool is run_*, and run_* takes a pool first")
        if name.startswith("run_"):
            returned = typing.get_type_hints(fn).get("return")
            if not (dataclasses.is_dataclass(returned) and returned.__dataclass_params__.frozen):
                wrong.append(f"{name} returns {returned!r}, not a frozen dataclass")
    assert wrong == []


def test_rank_functions_take_ctx_first():
    wrong = []
    for path in modules():
        if path.parent == PACKAGE:
            continue
        module_name = dotted(path)
        if path.parent.name in ("ui",):
            continue
        for name, fn in _functions(module_name):
            if name.endswith("_on_rank") and list(inspect.signature(fn).parameters)[:1] != ["ctx"]:
                wrong.append(name)
    assert wrong == []


def test_module_docstrings_say_what_the_module_holds_in_about_15_lines():
    """The explanations live in the notebooks, where learners read them; a module says what it holds."""
    import ast

    long = []
    for path in modules():
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False) or ""
        if len(doc.splitlines()) > 16:
            long.append(f"{path.relative_to(ROOT)}: {len(doc.splitlines())} lines")
    assert long == []


def test_a_module_over_300_lines_says_why_it_is_one_idea():
    """Modules are split by idea, not by a line count: one past 300 lines says in its docstring, in a
    sentence beginning "One idea:", why it stays whole."""
    import ast

    long = [f"{p.relative_to(ROOT)}: {n}" for p in modules() if (n := len(p.read_text().splitlines())) > 300
            and "One idea:" not in (ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert long == []


def mechanism_modules() -> tuple[str, ...]:
    """The mechanisms, found in the tree: every module a rank runs (``test_layers``' rank layer) that is
    not a rank-function module (``ranks.py``, or one defining ``*_on_rank``), and the pure modules of its
    own package it imports (the online softmax of the ring, the experts' routing)."""
    import ast

    from test_layers import direct_imports, layer_of, module_files

    files = module_files(PACKAGE)

    def rank_functions(path):
        body = ast.parse(path.read_text()).body
        return any(isinstance(n, ast.FunctionDef) and n.name.endswith("_on_rank") for n in body)

    found = {m for m in files if len(m.split(".")) == 3 and m.split(".")[1] != "runtime"
             and m.split(".")[2] != "ranks" and layer_of(m, files) == "rank" and not rank_functions(files[m])}
    for m in list(found):
        package = m.rpartition(".")[0]
        found |= {d for d in direct_imports(m, files[m], set(files))[0]
                  if d.rpartition(".")[0] == package and layer_of(d, files) == "pure"
                  and d.rpartition(".")[2] not in ("predict", "reference")}
    return tuple(sorted(m.removeprefix("shardlib.").replace(".", "/") for m in found))


MECHANISMS = mechanism_modules()


def test_the_mechanisms_are_found():
    assert {"tensor_parallel/layers", "tensor_parallel/blocks", "tensor_parallel/sequence_parallel", "pipeline/engine",
            "pipeline/messages", "experts/dispatch", "data_parallel/buckets", "data_parallel/zero3",
            "context_parallel/ring", "context_parallel/ulysses", "context_parallel/online_softmax",
            "serving/layouts"} <= set(MECHANISMS)
    assert "pipeline/torch_peer" not in MECHANISMS  # it runs torch's runtime on a rank, timed: a rank function


@pytest.mark.parametrize("module", MECHANISMS)
def test_a_mechanism_module_holds_no_measurement(module):
    """What a learner reads is the algorithm: clocks, spans and meters attach from ``ranks.py`` through a probe."""
    import ast

    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ("time", "timeit", "statistics")]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in ("time", "timeit", "statistics"):
                found.append(node.module)
            if (node.module or "").endswith("measure"):
                found += [a.name for a in node.names if a.name not in ("NO_PROBE", "Probe")]
        elif isinstance(node, ast.Attribute) and node.attr in ("timeline", "perf_counter", "thread_time", "sleep"):
            found.append(node.attr)
    assert found == [], f"{module} measures: {found}"
