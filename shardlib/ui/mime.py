"""Figures that show themselves without loading plotly's renderers: every figure function returns one.

In a plain Jupyter kernel plotly shows a figure by importing ``plotly.io``'s renderers, which import
nbformat, then jsonschema, then ``rfc3987_syntax``, which builds a grammar at import: 2 to 10 s of CPU on a
notebook's first figure. ``MimeFigure`` sends the very bundle plotly's default there (``plotly_mimetype``)
sends, without that import; anywhere else (a renderer chosen by the user or the environment, a static
export's formatter) it is an ordinary ``go.Figure``. ``mime_figure`` marks a function whose figures show
this way.
"""

from __future__ import annotations

import functools
import json
import os
import sys

import plotly.graph_objects as go

_OWN_RENDERERS = ("PLOTLY_RENDERER", "COLAB_NOTEBOOK_ID", "AZURE_NOTEBOOKS_HOST", "VSCODE_PID", "NTERACT_EXE",
                  "COCALC_PROJECT_ID", "DATABRICKS_RUNTIME_VERSION")  # where plotly picks a renderer of its own


def plain_kernel() -> bool:
    """Whether this is a plain Jupyter kernel where plotly would pick its default renderer (the mime bundle
    of ``plotly_bundle``): no renderer chosen by the user, imported or implied by the environment."""
    from IPython import get_ipython

    shell = get_ipython()
    return (shell is not None and type(shell).__module__.startswith("ipykernel.")
            and "plotly.io._renderers" not in sys.modules and not any(k in os.environ for k in _OWN_RENDERERS)
            and not os.path.exists("/kaggle/input"))


def plotly_bundle(fig: go.Figure) -> dict:
    """The mime bundle plotly's default renderer sends for ``fig`` in a plain Jupyter kernel."""
    return {"application/vnd.plotly.v1+json": json.loads(fig.to_json(validate=False, remove_uids=False)),
            "text/plain": f"<{fig.layout.title.text}>"}


class MimeFigure(go.Figure):
    """A figure that, in a plain Jupyter kernel where no plotly renderer was chosen, sends the bundle
    plotly's default renderer there sends, without importing the renderers (see the module docstring)."""

    def _ipython_display_(self) -> None:
        from IPython.display import display

        if not plain_kernel():
            return super()._ipython_display_()
        display(plotly_bundle(self), raw=True)


def as_mime(fig: go.Figure) -> go.Figure:
    """``fig`` itself, shown as a ``MimeFigure`` (a plain ``go.Figure`` only: a widget stays a widget)."""
    if type(fig) is go.Figure:
        fig.__class__ = MimeFigure
    return fig


def mime_figure(fn):
    """Decorate a function that returns a figure: the figure it returns shows as a ``MimeFigure``."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return as_mime(fn(*args, **kwargs))

    return wrapper
