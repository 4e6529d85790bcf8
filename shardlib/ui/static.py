"""Widgets as static pages: what a live widget shows at the moment it is displayed, as plain HTML.

A page exported without a kernel cannot move a slider, but it can show the figure and the text the
widget drew for its starting value. ``install()`` (run by the site builder before a notebook executes)
makes every widget and every plotly figure display as HTML: figures as ``<div>`` s drawn by a
``plotly.min.js`` that the page loads once, controls as a line saying their value and range.
"""

from __future__ import annotations

import html

import ipywidgets as widgets
from plotly.basedatatypes import BaseFigure

from shardlib.ui.live import FigureArea


def figure_html(fig: BaseFigure) -> str:
    """A plotly figure as a ``<div>``; the page must load plotly.js itself (once, in its head)."""
    return fig.to_html(full_html=False, include_plotlyjs=False)


def _control_html(w: widgets.Widget) -> str:
    name = html.escape(getattr(w, "description", "") or type(w).__name__)
    if isinstance(w, (widgets.IntSlider, widgets.FloatSlider, widgets.IntRangeSlider, widgets.FloatRangeSlider)):
        text = f"{name} = {w.value} (from {w.min} to {w.max})"
    elif isinstance(w, (widgets.SelectionSlider, widgets.Dropdown, widgets.ToggleButtons, widgets.RadioButtons,
                        widgets.Select)):
        labels = [str(o[0]) if isinstance(o, tuple) else str(o) for o in w.options]
        text = f"{name} = {w.label} (one of: {', '.join(labels)})"
    elif isinstance(w, (widgets.Checkbox, widgets.ToggleButton)):
        text = f"{name}: {'on' if w.value else 'off'}"
    elif isinstance(w, widgets.Button):
        text = f"[{name}]"
    else:
        return ""
    return (f'<div style="font-family:monospace;color:#555;margin:4px 0">{html.escape(text)} '
            f"<i>(move it in JupyterLab)</i></div>")


def _output_html(output: dict) -> str:
    data = output.get("data", {})
    if "text/html" in data:
        return data["text/html"]
    if output.get("output_type") == "stream":
        return f"<pre>{html.escape(output.get('text', ''))}</pre>"
    if "text/plain" in data:
        return f"<pre>{html.escape(data['text/plain'])}</pre>"
    return ""


def widget_html(w) -> str:
    """The static face of a widget tree: figures, text, outputs, and each control's current value."""
    if isinstance(w, BaseFigure):
        return figure_html(w)
    if isinstance(w, widgets.Box):
        direction = "row" if isinstance(w, widgets.HBox) else "column"
        inner = "".join(widget_html(c) for c in w.children)
        return f'<div style="display:flex;flex-direction:{direction};gap:8px">{inner}</div>'
    if isinstance(w, (widgets.HTML, widgets.HTMLMath)):
        return f"<div>{w.value}</div>"
    if isinstance(w, widgets.Label):
        return f"<div>{html.escape(w.value)}</div>"
    if isinstance(w, FigureArea):
        return figure_html(w.figure) if w.figure is not None else ""
    if isinstance(w, widgets.Output):
        return "".join(_output_html(o) for o in w.outputs)
    return _control_html(w)


def _bundle(obj) -> dict:
    return {"text/html": widget_html(obj), "text/plain": f"<{type(obj).__name__}>"}


def install(shell=None) -> None:
    """Display widgets and plotly figures as static HTML in this kernel from now on."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is None:
        raise RuntimeError("static.install() needs an IPython kernel")
    from IPython.display import display

    formatters = shell.display_formatter
    formatters.mimebundle_formatter.for_type(widgets.Widget, _bundle)
    # plotly figures display themselves (``_ipython_display_``), ahead of any mime bundle: take that step.
    formatters.ipython_display_formatter.for_type(BaseFigure, lambda fig: display(_bundle(fig), raw=True))
