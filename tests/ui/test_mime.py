"""Every figure function returns a figure that shows without plotly's renderers (``shardlib.ui.mime``)."""

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import plotly.graph_objects as go

from shardlib.ui.mime import MimeFigure, as_mime, mime_figure

UI = Path(__file__).resolve().parents[2] / "shardlib" / "ui"
FIGURE_MODULES = sorted(p.stem for p in UI.glob("*.py") if p.stem.endswith("_figures") or p.stem == "gantt")


def test_every_figure_function_is_marked():
    unmarked = []
    for stem in FIGURE_MODULES:
        module = importlib.import_module(f"shardlib.ui.{stem}")
        for name, fn in vars(module).items():
            if name.endswith("_figure") and inspect.isfunction(fn) and fn.__module__ == module.__name__:
                if not hasattr(fn, "__wrapped__"):
                    unmarked.append(f"{stem}.{name}")
    assert unmarked == []


def test_a_plain_figure_becomes_a_mime_figure_and_a_widget_stays_a_widget():
    fig = as_mime(go.Figure(go.Bar(x=[1], y=[2])))
    assert type(fig) is MimeFigure and list(fig.data[0].y) == [2]
    widget = go.FigureWidget()
    kind = type(widget)
    assert as_mime(widget) is widget
    assert type(widget) is kind and not isinstance(widget, MimeFigure)
    made = mime_figure(lambda: go.Figure())()
    assert type(made) is MimeFigure


def test_making_a_figure_does_not_import_the_renderers():
    code = ("import sys; from shardlib.ui.intro_figures import weights_vs_memory_figure; "
            "fig = weights_vs_memory_figure({'a': 1e9}, {'b': 2e9}); fig.to_json(); "
            "print(type(fig).__name__, 'plotly.io._renderers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["MimeFigure", "False"]


def test_no_widget_draws_in_a_figure_widget():
    """A ``go.FigureWidget`` imports the renderers the first time one is made (about 2 s of a notebook's
    Run All): every widget draws in a ``FigureArea`` instead."""
    users = [p.name for p in sorted(UI.glob("*_widgets.py")) if "FigureWidget(" in p.read_text()]
    assert users == []


def test_making_and_moving_an_explorer_does_not_import_the_renderers():
    code = ("import sys; from shardlib.ui.costs_widgets import tp_cost_explorer; "
            "from shardlib.facts.hardware import LINKS; from shardlib.ui.training_widgets import moe_layout_explorer; "
            "box = tp_cost_explorer(list(LINKS.values())); box.children[1].value = box.children[1].options[-1]; "
            "moe = moe_layout_explorer(); area = box.children[6]; "
            "print(type(area).__name__, type(area.figure).__name__, 'plotly.io._renderers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["FigureArea", "MimeFigure", "False"]  # (outside a kernel, display prints)
