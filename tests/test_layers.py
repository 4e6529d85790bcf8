"""The package's layers hold: imports point down only, and pure modules stay pure.

Every module of ``shardlib`` gets its layer from the tree, not from a list:

    pure      its file named for the role (``reference.py``, ``predict.py``), or its docstring saying so
              ("Pure: no torch.", "Pure: torch, no ranks."); "no torch" there means no torch at all
    runtime   the rest of ``runtime/``: the rank pool, the worker, the context, recorded collectives
    rank      ``ranks.py``, and every other module that imports torch: the mechanisms a rank runs
    driver    ``drivers.py`` and ``*_drivers.py``, and the few entry points in ``DRIVERS``
    ui        ``ui/``; exercises sit beside it

A module that none of these places (no role name, no word in its docstring, no torch) has no layer, and
this test says so. A module may import modules of its own layer or below. Pure modules import no
``torch.distributed``, no plotly, no ipywidgets; nothing below the UI imports plotly or ipywidgets. The
walk is static (the import statements of each file) and transitive, and it counts the ``__init__`` of
every package a module lives in, because Python runs those too.
"""

from __future__ import annotations

import ast
import functools
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "shardlib"
ORDER = {"infra": -1, "pure": 0, "runtime": 1, "rank": 2, "driver": 3, "ui": 4, "exercises": 4}
ROLES = {"reference": "pure", "predict": "pure", "ranks": "rank", "drivers": "driver"}
# Entry points that run rank functions on a pool or under torchrun without a role's file name.
DRIVERS = {"shardlib.serving.across", "shardlib.serving.machines", "shardlib.training.machines",
           "shardlib.training.step_time", "shardlib.launch", "shardlib.serving.fleet.cold_start"}
PURE_WORDS = re.compile(r"\bpure\b|\bno ranks\b", re.IGNORECASE)
NO_TORCH_WORDS = re.compile(r"\bno (``)?torch(``)?(?!\.\w)")  # "no torch", not "no torch.distributed"
UI_LIBRARIES = ("plotly", "ipywidgets", "IPython", "anywidget")


def _docstring(path: Path) -> str:
    return _docstring_of(path.read_text())


@functools.lru_cache(maxsize=None)
def _tree(source: str) -> ast.Module:
    return ast.parse(source)


@functools.lru_cache(maxsize=None)
def _docstring_of(source: str) -> str:
    # keyed by the file's text: the walk asks for each module's layer once per module that reaches it,
    # and the copies the tests below break differ from the tree in one file only
    return " ".join((ast.get_docstring(_tree(source), clean=False) or "").split())


def says_pure(path: Path) -> bool:
    return bool(PURE_WORDS.search(_docstring(path)))


def says_no_torch(path: Path) -> bool:
    return says_pure(path) and bool(NO_TORCH_WORDS.search(_docstring(path)))


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root``, by dotted name (packages by their own name)."""
    out = {}
    for path in root.rglob("*.py"):
        parts = (root.name,) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def direct_imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """``(internal, external)``: the package's modules and the outside modules ``path`` imports,
    wherever in the file (a function-local import counts as much as one at the top), but for those under
    ``if TYPE_CHECKING:``, which Python never runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    internal, external = set(), set()
    tree = _tree(path.read_text())
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(block.test) for stmt in block.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            (internal if target in known else external if target.split(".")[0] != "shardlib" else set()).add(target)
    return internal, external


def with_parents(module: str) -> set[str]:
    """``module`` and every package above it: importing it runs all of their ``__init__`` s."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def closure(start: str, graph: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        m = todo.pop()
        for dep in graph[m]:
            for d in with_parents(dep):
                if d not in seen and d != start:
                    seen.add(d)
                    todo.append(d)
    return seen


def layer_of(module: str, files: dict[str, Path], externals: dict[str, set[str]] | None = None) -> str:
    """The module's layer, read from its place in the tree, its file name and its docstring."""
    parts, path = module.split("."), files[module]
    if path.name == "__init__.py" or module == "shardlib._lazy":
        return "infra"
    if parts[1] in ("ui", "exercises"):
        return parts[1]
    role = ROLES.get(parts[-1], "driver" if parts[-1].endswith("_drivers") else None) if len(parts) >= 3 else None
    if parts[1] == "runtime" and not says_pure(path):
        return "runtime"
    if role:
        return role
    if says_pure(path):
        return "pure"
    if module in DRIVERS:
        return "driver"
    imports = direct_imports(module, path, set(files))[1] if externals is None else externals[module]
    if any(m == "torch" or m.startswith("torch.") for m in imports):
        return "rank"
    raise KeyError(module)


def violations(root: Path) -> list[str]:
    """Every broken layering rule in the package at ``root``, in words."""
    files = module_files(root)
    graph, externals = {}, {}
    for name, path in files.items():
        graph[name], externals[name] = direct_imports(name, path, set(files))
    found = []
    for name in sorted(files):
        try:
            layer = layer_of(name, files, externals)
        except KeyError:
            found.append(f"{name} has no layer: name it for its role, or say \"Pure: no torch.\" (or what it is) "
                         "in its docstring")
            continue
        reached = closure(name, graph)
        outside = set(externals[name]).union(*(externals[m] for m in reached))
        for dep in sorted(reached):
            dep_layer = layer_of(dep, files, externals) if dep in files else "infra"
            if ORDER[dep_layer] > ORDER[layer]:
                found.append(f"{name} ({layer}) imports {dep} ({dep_layer}), a layer above it")
        if layer == "pure" and any(m == "torch.distributed" or m.startswith("torch.distributed.") for m in outside):
            found.append(f"{name} (pure) imports torch.distributed")
        if layer == "pure" and says_no_torch(files[name]) and any(m == "torch" or m.startswith("torch.")
                                                                  for m in outside):
            found.append(f"{name} (pure, no torch) imports torch")
        if ORDER[layer] < ORDER["ui"] and any(m.split(".")[0] in UI_LIBRARIES for m in outside):
            found.append(f"{name} ({layer}) imports a UI library: "
                         f"{sorted(m for m in outside if m.split('.')[0] in UI_LIBRARIES)}")
    return found


def test_the_package_keeps_its_layers():
    assert violations(ROOT) == []


def test_every_listed_driver_exists_and_needs_its_listing():
    files = module_files(ROOT)
    assert sorted(m for m in DRIVERS if m not in files) == []
    unlisted = {m: layer_of(m, files) for m in DRIVERS if not says_pure(files[m])}
    assert all(layer == "driver" for layer in unlisted.values()), unlisted


def test_the_pure_modules_say_so_and_the_ones_without_torch_say_that_too():
    """The docstrings carry the layers: a sample of what each rule finds in today's tree."""
    files = module_files(ROOT)
    layers = {m: layer_of(m, files) for m in files}
    no_torch = {m for m in files if layers[m] == "pure" and says_no_torch(files[m])}
    assert {"shardlib.models", "shardlib.checks", "shardlib.costs.alpha_beta", "shardlib.serving.cost",
            "shardlib.serving.planner", "shardlib.training.time_model", "shardlib.runtime.records",
            "shardlib.serving.fleet.router"} <= no_torch
    assert {"shardlib.toy", "shardlib.runtime.measure", "shardlib.training.toy_prediction"} <= {
        m for m in files if layers[m] == "pure"} - no_torch  # pure, with torch
    assert layers["shardlib.runtime.comm"] == "runtime" and layers["shardlib.runtime.ranks"] == "runtime"
    assert layers["shardlib.pipeline.engine"] == layers["shardlib.tensor_parallel.layers"] == "rank"
    assert layers["shardlib.pipeline.bubble_drivers"] == layers["shardlib.serving.drivers"] == "driver"
    assert "shardlib.serving.fleet.goodput" in no_torch and layers["shardlib.serving.fleet.pools"] == "pure"
    assert layers["shardlib.serving.fleet.handoff"] == layers["shardlib.serving.fleet.disagg"] == "rank"
    assert layers["shardlib.serving.fleet.drivers"] == layers["shardlib.serving.fleet.disagg_drivers"] == "driver"


@pytest.mark.parametrize("module, line, expected", [
    ("pipeline/predict.py", "from ..runtime.ranks import Ranks",
     "shardlib.pipeline.predict (pure) imports shardlib.runtime.ranks (runtime), a layer above it"),
    ("costs/alpha_beta.py", "import torch.distributed as dist",
     "shardlib.costs.alpha_beta (pure) imports torch.distributed"),
    ("serving/planner.py", "import torch", "shardlib.serving.planner (pure, no torch) imports torch"),
    ("experts/ranks.py", "from ..ui.theme import RED",
     "shardlib.experts.ranks (rank) imports shardlib.ui.theme (ui)"),
    ("costs/drivers.py", "import plotly.graph_objects as go", "shardlib.costs.drivers (driver) imports a UI library"),
    # one step removed: a pure module that imports a pure module that imports the runtime
    ("models.py", "def _late():\n    from .runtime.comm import Comm",
     "shardlib.models (pure) imports shardlib.runtime.comm"),
])
def test_the_walk_catches_a_module_that_breaks_its_layer(tmp_path, module, line, expected):
    """Copy the package, break one rule, and the walk must say so (a check that cannot fail is no check)."""
    copy = tmp_path / "shardlib"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / module, "a") as f:
        f.write("\n" + line + "\n")
    found = violations(copy)
    assert any(expected in v for v in found), found
    if module == "models.py":  # toy.py imports models: the break reaches it too
        assert any(v.startswith("shardlib.toy (pure) imports shardlib.runtime.comm") for v in found), found


def test_a_new_module_must_be_given_a_layer(tmp_path):
    copy = tmp_path / "shardlib"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "costs" / "extra.py").write_text("X = 1\n")
    assert violations(copy) == ["shardlib.costs.extra has no layer: name it for its role, or say \"Pure: no torch.\" "
                                "(or what it is) in its docstring"]


def test_a_docstring_that_says_no_torch_is_held_to_it(tmp_path):
    copy = tmp_path / "shardlib"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "costs" / "extra.py").write_text('"""A formula. Pure: no torch."""\nimport torch\n')
    (copy / "serving" / "extra.py").write_text('"""Pure: torch, no ranks."""\nfrom ..runtime.comm import Comm\n')
    found = violations(copy)
    assert "shardlib.costs.extra (pure, no torch) imports torch" in found
    assert any(v.startswith("shardlib.serving.extra (pure) imports shardlib.runtime.comm (runtime)") for v in found)
    # a mechanism (torch, no word in its docstring) is a rank module: the pure may not import it
    (copy / "serving" / "extra.py").write_text('"""A mechanism."""\nimport torch\n')
    with open(copy / "serving" / "fit.py", "a") as f:
        f.write("\nfrom .extra import torch\n")
    assert any(v.startswith("shardlib.serving.fit (pure) imports shardlib.serving.extra (rank)")
               for v in violations(copy))


def test_importing_a_pure_module_does_not_start_the_runtime():
    """The package ``__init__`` s load their names lazily, so a pure module imported on its own brings
    neither torch nor the rank runtime with it (checked in a fresh interpreter)."""
    import subprocess
    import sys

    code = ("import sys; import shardlib.serving.planner, shardlib.serving.cost, shardlib.pipeline.predict, "
            "shardlib.costs.predict; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('shardlib.runtime.r')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_runtime_imports_nothing_above_it():
    """``runtime/`` sits under every strategy: it may use the facts and checks below it, nothing else."""
    files = module_files(ROOT)
    graph = {name: direct_imports(name, path, set(files))[0] for name, path in files.items()}
    below = {"shardlib", "shardlib._lazy", "shardlib.checks", "shardlib.models", "shardlib.hardware", "shardlib.toy"}
    found = {f"{name} imports {dep}" for name in files if name.startswith("shardlib.runtime")
             for dep in closure(name, graph) if not dep.startswith("shardlib.runtime") and dep not in below}
    assert sorted(found) == []


# The tree by workload: the shared facts at the bottom, the runtime on them, one package per strategy, the
# workloads (serving, training) composed from the strategies, and what a learner sees on top.
TIERS = {"base": 0, "runtime": 1, "strategy": 2, "workload": 3, "ui": 4}
WORKLOADS = {"serving", "training"}


def tier_of(module: str, files: dict[str, Path]) -> str:
    parts = module.split(".")
    if len(parts) == 1 or files[module].parent == ROOT and files[module].name != "__init__.py":
        return "base"  # shardlib's own modules: checks, models, hardware, toy, mesh, units, launch
    package = parts[1]
    if package == "runtime":
        return "runtime"
    if package in WORKLOADS:
        return "workload"
    if package in ("ui", "exercises"):
        return "ui"
    return "strategy"


def package_violations(root: Path) -> list[str]:
    """Imports that point up the tree's tiers, and cycles between packages, in words."""
    files = module_files(root)
    graph = {name: direct_imports(name, path, set(files))[0] for name, path in files.items()}
    found, packages = [], {}
    for name in sorted(files):
        if name == "shardlib.launch":  # the torchrun entry runs any rank function: it reaches everything
            continue
        for dep in sorted(graph[name]):
            if dep in ("shardlib", "shardlib._lazy"):
                continue
            if TIERS[tier_of(dep, files)] > TIERS[tier_of(name, files)]:
                found.append(f"{name} ({tier_of(name, files)}) imports {dep} ({tier_of(dep, files)})")
            a, b = name.split(".")[:2], dep.split(".")[:2]
            if len(a) == 2 and len(b) == 2 and a != b and (root / a[1]).is_dir() and (root / b[1]).is_dir():
                packages.setdefault(a[1], set()).add(b[1])
    for a, deps in sorted(packages.items()):
        for b in sorted(deps):
            if a in packages.get(b, set()) and a < b:
                found.append(f"shardlib.{a} and shardlib.{b} import each other")
    return found


def test_the_tree_keeps_its_tiers_and_has_no_package_cycle():
    assert package_violations(ROOT) == []


def test_the_tier_walk_catches_an_upward_import_and_a_cycle(tmp_path):
    copy = tmp_path / "shardlib"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with open(copy / "pipeline" / "stages.py", "a") as f:
        f.write("\nfrom ..training.time_model import TrainingWorkload\n")
    with open(copy / "serving" / "fit.py", "a") as f:
        f.write("\nfrom ..training.memory import TrainingMemory\n")
    with open(copy / "training" / "memory.py", "a") as f:
        f.write("\nfrom ..serving.fit import GpuFit\n")
    found = package_violations(copy)
    assert "shardlib.pipeline.stages (strategy) imports shardlib.training.time_model (workload)" in found
    assert "shardlib.serving and shardlib.training import each other" in found
