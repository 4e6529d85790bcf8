import pytest

from shardlib.ui.quiz import Question, question_widget, questions_html, show_questions

Q = Question(prompt="How many all-reduces per column-then-row pair?", choices=("0", "1", "2"), answer=1,
             why="The row-parallel half leaves partial sums.")


def test_choice_reveals_right_or_wrong_with_the_reason():
    box = question_widget(Q)
    buttons, feedback = box.children[1], box.children[2]
    assert feedback.value == ""                      # nothing shown before a choice
    buttons.value = 2
    assert "Not quite" in feedback.value and "\u201c1\u201d" in feedback.value and "partial sums" in feedback.value
    buttons.value = 1
    assert feedback.value.count("Right.") == 1 and "partial sums" in feedback.value


def test_static_html_carries_every_question_and_answer():
    q2 = Question("Second?", ["yes", "no"], 0, "Because.")
    text = questions_html([Q, q2])
    assert text.count("<details>") == 2 and "<b>1</b>" in text and "<b>yes</b>" in text
    bundle = show_questions(Q, q2)._repr_mimebundle_()
    assert bundle["text/html"] == text
    assert "application/vnd.jupyter.widget-view+json" in bundle


@pytest.mark.parametrize("kwargs, words", [
    (dict(choices=("only",), answer=0), "at least 2 choices, got 1"),
    (dict(choices=("a", "b"), answer=2), "answer 2 is not one of the 2 choices"),
    (dict(choices=("a", "b"), answer=-1), "answer -1"),
])
def test_bad_questions_say_what_is_wrong(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Question(prompt="p", why="w", **kwargs)


def test_check_yourself_needs_questions():
    with pytest.raises(ValueError, match="at least one Question"):
        show_questions()
    with pytest.raises(ValueError, match="Question objects, got str"):
        show_questions("what?")
