"""Widgets that never die silently: a callback's error is shown under the widget, in the learner's terms.

``SelectionSlider`` is the stock slider, refusing the option value that breaks it at an end; ``slider``
one that answers when released. ``FigureArea`` is where a widget draws its figure, each draw in place of
the last. ``wire`` draws an explorer once and redraws it, guarded, on every move of its controls.

In JupyterLab an exception raised inside a widget's callback does not appear in the notebook: it goes to
the log console, which a learner never opens, and the widget just stops answering. Every widget of the
suite therefore runs its callbacks through ``Feedback.guard`` (``wire``): the first draw runs unguarded (an error
there is a cell error, which everybody sees), and every later move that fails writes what went wrong
into ``Feedback.area``, a line under the controls, and how to get going again. The log console stays
clean.
"""

from __future__ import annotations

import html
from typing import Callable

import ipywidgets as widgets
from IPython.display import display

from shardlib.runtime.errors import PoolClosedError, RankError, RankTimeoutError
from shardlib.ui.mime import plain_kernel, plotly_bundle
from shardlib.ui.theme import WRONG_COLOUR


def explain(exc: BaseException) -> str:
    """What a learner should read about ``exc``: what happened, and what to do next (plain text)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, PoolClosedError):
        return ("The ranks this widget runs on have been closed. Run the cell that starts them "
                "(Ranks(...)) again, then the cell that made this widget.")
    if isinstance(exc, RankTimeoutError):
        return f"The ranks did not answer in time ({first}). The pool restarted itself: move the control again."
    if isinstance(exc, RankError):
        return f"A rank failed: {first}. The pool restarted itself: move the control again."
    if isinstance(exc, ValueError):
        return f"That setting cannot run: {first}"
    return f"Something went wrong ({type(exc).__name__}): {first}"


class Feedback:
    """The error line under a widget's controls (``area``) and the guard its callbacks run in."""

    def __init__(self) -> None:
        self.area = widgets.HTML(value="")
        self.last_error: BaseException | None = None

    def guard(self, callback: Callable[..., None]) -> Callable[..., None]:
        """``callback`` that, instead of raising, shows the error in ``area`` (and clears it when a later
        call succeeds)."""

        def run(*args, **kwargs) -> None:
            try:
                callback(*args, **kwargs)
            except Exception as exc:  # shown to the learner instead of the log console
                self.last_error = exc
                self.area.value = (f'<div style="color:{WRONG_COLOUR};margin:4px 0">'
                                   f"{html.escape(explain(exc))}</div>")
            else:
                self.last_error = None
                self.area.value = ""

        return run


def wire(controls, redraw: Callable[..., None]) -> widgets.HTML:
    """Draw once (unguarded: an error is the cell's), then redraw, guarded, whenever any of ``controls``
    changes value. Returns the error line to place under the controls."""
    feedback = Feedback()
    redraw()
    guarded = feedback.guard(redraw)
    for control in controls:
        control.observe(guarded, names="value")
    return feedback.area


def nearest(value: float, choices) -> float:
    """The one of ``choices`` closest to ``value``: where a slider of those choices starts."""
    return min(choices, key=lambda c: abs(c - value))


class SelectionSlider(widgets.SelectionSlider):
    """ipywidgets' ``SelectionSlider``, refusing ``None`` as an option's value: ipywidgets reads a ``None``
    value as "nothing selected", so a slider taken to that option raises a ``TraitError`` into the log
    console (index set to ``None``) before any callback runs. Give that option another value instead."""

    def __init__(self, *args, **kwargs) -> None:
        options = kwargs.get("options", args[0] if args else ())
        pairs = options.items() if isinstance(options, dict) else options
        empty = [o[0] if isinstance(o, tuple) else o for o in pairs if (o[1] if isinstance(o, tuple) else o) is None]
        if empty:
            raise ValueError(f"slider option {empty[0]!r} has the value None, which ipywidgets takes for 'nothing "
                             "selected': the slider breaks when taken there; give it another value")
        super().__init__(*args, **kwargs)


def slider(options, value, description: str, **kwargs) -> SelectionSlider:
    """A ``SelectionSlider`` over ``options`` that answers when released, its description shown in full."""
    return SelectionSlider(options=options, value=value, description=description, continuous_update=False,
                           style={"description_width": "initial"}, **kwargs)


class FigureArea(widgets.Output):
    """Where a widget draws its figure: ``show(fig)`` puts ``fig`` in place of the last one, and ``figure`` is
    the one shown. Not a ``go.FigureWidget``: making the first of those in a kernel imports plotly's
    renderers (nbformat, jsonschema and a grammar built at import), about 2 s.

    In a plain Jupyter kernel the figure is written into the widget's outputs from the kernel, as one mime
    bundle. Captured instead (``with area: display(fig)``), it would make a notebook runner (nbclient: nbconvert,
    papermill) echo each captured output back on the shell channel while it waits there for the cell's reply,
    and that wait sometimes never ends (nbclient issue 312). Elsewhere (a renderer of plotly's own) it is
    captured, so that renderer draws it."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.figure = None

    def show(self, fig) -> None:
        from IPython import get_ipython

        if plain_kernel():
            self.outputs = ({"output_type": "display_data", "data": plotly_bundle(fig), "metadata": {}},)
        elif get_ipython() is not None:
            with self:
                self.clear_output(wait=True)
                display(fig)
        self.figure = fig
