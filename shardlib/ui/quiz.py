"""Check-yourself questions: one small widget per question that reveals the answer after a choice.

The same questions also render as static HTML (a numbered list with each answer folded in a
``<details>`` block), which is what a page without a kernel shows: the exported site, or a notebook
viewer that cannot run widgets.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import ipywidgets as widgets

from shardlib.ui.theme import RIGHT_COLOUR, WRONG_COLOUR


@dataclass(frozen=True)
class Question:
    """A multiple-choice question: ``choices[answer]`` is right, and ``why`` says why."""

    prompt: str
    choices: tuple[str, ...]
    answer: int
    why: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "choices", tuple(self.choices))
        if len(self.choices) < 2:
            raise ValueError(f"a question needs at least 2 choices, got {len(self.choices)}: {self.prompt!r}")
        if not 0 <= self.answer < len(self.choices):
            raise ValueError(
                f"answer {self.answer} is not one of the {len(self.choices)} choices "
                f"(0 .. {len(self.choices) - 1}): {self.prompt!r}"
            )
        if not self.prompt.strip() or not self.why.strip():
            raise ValueError("a question needs a prompt and a why")

    def feedback(self, choice: int) -> str:
        """What the learner reads after picking ``choices[choice]`` (plain text)."""
        if not 0 <= choice < len(self.choices):
            raise ValueError(f"choice {choice} is not one of 0 .. {len(self.choices) - 1}")
        if choice == self.answer:
            return f"Right. {self.why}"
        return f"Not quite: the answer is \u201c{self.choices[self.answer]}\u201d. {self.why}"


def question_widget(question: Question, number: int = 1) -> widgets.VBox:
    """The prompt, one button per choice, and the feedback that appears once a choice is made."""
    prompt = widgets.HTML(f"<b>{number}.</b> {html.escape(question.prompt)}")
    buttons = widgets.RadioButtons(options=[(c, i) for i, c in enumerate(question.choices)], value=None,
                                   layout=widgets.Layout(width="max-content"))
    feedback = widgets.HTML()

    def on_choice(change) -> None:
        if change["new"] is None:
            feedback.value = ""
            return
        right = change["new"] == question.answer
        colour = RIGHT_COLOUR if right else WRONG_COLOUR
        feedback.value = f'<span style="color:{colour}">{html.escape(question.feedback(change["new"]))}</span>'

    buttons.observe(on_choice, names="value")
    return widgets.VBox([prompt, buttons, feedback])


def questions_html(questions: tuple[Question, ...] | list[Question]) -> str:
    """The static version: a numbered list, each answer folded under ``Answer``."""
    items = []
    for q in questions:
        choices = "".join(f"<li>{html.escape(c)}</li>" for c in q.choices)
        items.append(
            f"<li>{html.escape(q.prompt)}<ul>{choices}</ul><details><summary>Answer</summary>"
            f"<b>{html.escape(q.choices[q.answer])}</b>. {html.escape(q.why)}</details></li>"
        )
    return f"<ol>{''.join(items)}</ol>"


class CheckYourself:
    """Displays as live widgets in JupyterLab and as static HTML wherever widgets cannot run."""

    def __init__(self, questions: tuple[Question, ...]) -> None:
        if not questions:
            raise ValueError("show_questions needs at least one Question")
        for q in questions:
            if not isinstance(q, Question):
                raise ValueError(f"show_questions takes Question objects, got {type(q).__name__}")
        self.questions = tuple(questions)
        self.widget = widgets.VBox([question_widget(q, i + 1) for i, q in enumerate(self.questions)])

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = self.widget._repr_mimebundle_() or {}
        bundle = dict(bundle)
        bundle["text/html"] = questions_html(self.questions)
        bundle["text/plain"] = "\n".join(f"{i + 1}. {q.prompt}" for i, q in enumerate(self.questions))
        return bundle


def show_questions(*questions: Question) -> CheckYourself:
    """``show_questions(Question(...), Question(...))`` as the last line of a cell shows them."""
    return CheckYourself(questions)
