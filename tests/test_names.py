"""The package keeps its own vocabulary: every module is on FILES.md's map and in its package's
docstring, pool drivers are ``run_*`` and return frozen dataclasses, rank functions end in ``_on_rank``, a module
is at most 300 lines, and the core measures nothing."""

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


def files_map() -> set[str]:
    """Paths of the modules FILES.md's layout block names (``shardlib/core/pipeline/engine.py``); a folder's
    entries are indented two more spaces than the folder."""
    text = (ROOT / "FILES.md").read_text()
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
    """``shardlib/core/serving/blocks.py`` -> ``shardlib.core.serving.blocks``."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_every_module_is_on_the_files_map():
    listed = files_map()
    missing = [p.relative_to(ROOT).as_posix() for p in modules() if p.relative_to(ROOT).as_posix() not in listed]
    assert missing == [], "add these to FILES.md's layout block"
    stale = sorted(p for p in listed if not (ROOT / p).exists())
    assert stale == [], "FILES.md's layout names modules that do not exist"


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
        if inspect.isfunction(fn) and fn.__module__ == module_name and name == fn.__name__ and not name.startswith("_"):
            yield name, fn  # what the module defines (a second name bound to it is not a second function)


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


def test_a_module_is_at_most_300_lines():
    """Modules are cut by idea; an idea that needs more than 300 lines is two ideas."""
    long = [f"{p.relative_to(ROOT)}: {n}" for p in modules() if (n := len(p.read_text().splitlines())) > 300]
    assert long == []


CORE_MODULES = sorted(p for p in (PACKAGE / "core").rglob("*.py"))


@pytest.mark.parametrize("path", CORE_MODULES, ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_a_core_module_holds_no_measurement(path):
    """What a learner reads is the algorithm: clocks, spans and meters attach from ``lab/`` through a probe,
    and the serving engine reads the rank's clock through ``ctx.now_s()``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ("time", "timeit", "statistics")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("time", "timeit",
                                                                                        "statistics"):
            found.append(node.module)
        elif isinstance(node, ast.Attribute) and node.attr in ("timeline", "perf_counter", "thread_time", "sleep"):
            found.append(node.attr)
    assert found == [], f"{path.relative_to(PACKAGE)} measures: {found}"


INTERFACE = """Ranks Layout ModelConfig PRESETS TOY LLAMA_3_70B LLAMA_3_1_405B DEEPSEEK_V3 H100_80GB gpu_cluster
ONE_NODE_8_H100 TWO_NODES_8_H100 Link NVLINK GPU_MEMORY_BYTES plan_serving plan_training Workload TrainingWorkload
training_choices TrainingConfig run_training train_reference run_pipeline make_schedule pipeline_bubble_fraction
ring_attention run_data_parallel train_data_parallel run_replicas run_disaggregated Request EngineConfig run_serving
weights_from_hf_llama random_hf_llama poisson_trace expert_all_to_all memory_per_rank layer_activation_bytes
tp_decode_cost tensor_parallel_problems pipeline_parallel_problems all_reduce_s fit_link Question""".split()


def test_the_names_engineers_and_the_exercises_call_are_importable():
    """Each name the course's readers call is defined in some module of shardlib (modules may move)."""
    found = set()
    for path in modules():
        found.update(vars(importlib.import_module(dotted(path))))
    assert [name for name in INTERFACE if name not in found] == []
