"""The install files agree with each other."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"torch": "pytorch"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_lists_what_pyproject_needs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_name(s) for s in project["dependencies"] + extras["test"] + extras["site"]}
    conda = set()
    text = (ROOT / "environment.yml").read_text()
    for line in text[text.index("dependencies:"):].splitlines():
        m = re.match(r"\s+- ([A-Za-z][\w.-]*)", line)
        if m and m.group(1) not in ("pip", "python"):
            conda.add(m.group(1).lower())
    assert {CONDA_NAMES.get(n, n) for n in wanted} == conda
    # The browser extra comes from pip, with the project itself.
    assert "- -e .[browser]" in text and "browser" in project["optional-dependencies"]


def test_make_installs_the_extras_the_suite_uses():
    makefile = (ROOT / "Makefile").read_text()
    assert '-e ".[test,browser,site]"' in makefile


def test_binder_installs_the_project_and_a_pinned_torch():
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    assert "-e ." in lines
    assert any(re.fullmatch(r"torch==[\d.]+", line) for line in lines)
    assert (ROOT / "binder" / "start").read_text().rstrip().endswith('exec "$@"')


def test_binder_badge_opens_jupyterlab_at_notebook_00():
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"\(https://mybinder\.org/v2/gh/[^)]*\?urlpath=lab/tree/([^)]+)\)", readme)
    assert m, "README has no Binder badge that opens JupyterLab"
    assert (ROOT / m.group(1)).is_file() and m.group(1).endswith("00_start_here.ipynb")


def test_jupyterlab_opens_without_the_news_prompt():
    """``make lab`` and Binder install one settings override: JupyterLab never asks about Jupyter's news."""
    import json
    import sys

    overrides = json.loads((ROOT / "binder" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"] == {"fetchNews": "false", "checkForUpdates": False}
    assert "binder/overrides.json" in (ROOT / "binder" / "postBuild").read_text()
    assert "binder/overrides.json" in (ROOT / "Makefile").read_text()
    installed = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings" / "overrides.json"
    if Path(sys.prefix).resolve() == (ROOT / ".venv").resolve():  # the project's own environment: installed
        assert json.loads(installed.read_text()) == overrides
