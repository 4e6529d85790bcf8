"""``scripts/course_counts.py`` counts what a learner meets: checked on a notebook written here, then run
over the course (its budgets are asserted with ``--check`` once every notebook meets them)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("course_counts", ROOT / "scripts" / "course_counts.py")
counts = importlib.util.module_from_spec(spec)
sys.modules["course_counts"] = counts  # dataclasses look their module up while the class is made
spec.loader.exec_module(counts)

NOTEBOOK = '''# %% [markdown]
# # 99 · A test
#
# > **Part I, serving a model that does not fit.** Assumes: [01](01_tensor_parallel.ipynb).
# > Reading time: about 5 minutes. Trades: memory for communication.
#
# **What you will see.**
#
# - One short bullet.
# - Another bullet here.
# - A third.
#
# ## The idea
#
# This sentence has exactly six words. Is this one a question? Yes!
# <details><summary>Folded</summary>
# These words are folded away and never count at all.
# </details>
#
# | a table | is not prose |
#
# ### Worked problem 1
#
# Compute `2 * 3` now.
#
# **Worked problem 2.** Long: ''' + " ".join(["word"] * 45) + '''.

# %%
Question("p?", ("a", "bb", "c"), 1, "why")
Question("q?", choices=("long one", "x"), answer=0, explanation="why")
'''


def test_counts_on_a_notebook_written_here(tmp_path):
    path = tmp_path / "99_test.py"
    path.write_text(NOTEBOOK)
    c = counts.count(path)
    assert c.bullets_seen == 3
    assert c.worked_problems == 2
    assert c.answers == (1, 0) and c.longest == 2 and c.shortest == 0
    assert c.long_sentences == 1  # the 47-word one; the folded text and the table are not read
    assert c.header and not any("header" in p for p in c.problems())
    assert not counts.has_header(["# 99 · A test\n\n> **Part I.** Assumes: 01."])  # no reading time, no trade
    prose = counts.visible_prose(counts.markdown_cells(NOTEBOOK))
    assert "folded" not in prose and "table" not in prose
    assert "This sentence has exactly six words." in counts.sentences(prose)
    assert counts.course_problems([c]) == [
        "position 0 holds 1 of 2 right answers (at most 40%)",
        "the right answer is the longest choice in 2 of 2 questions (at most a third)"]


QUESTIONS = '''# %%
Question("a?", ("x", "yy", "zzz"), 0, "why")
Question("b?", ("a bare one", "a reasoned one, with its why"), 0, "why")
Question("c?", choices=("aa", "bb", "c"), answer=0, why="a tie for the longest is neither")
Question("d?", ("same", "four", "char"), 2, "all tied")
Question("e?", (f"{x:.1f} ms", "1,000 ms"), 0, "an f-string is measured as written")
'''


def test_the_shortest_right_answer_is_counted_and_held_to_a_third(tmp_path):
    """A habit of picking the shortest choice must not win: the right choice strictly the shortest in at most a
    third of the questions. A tie is neither the shortest nor the longest; a string is measured as shown."""
    path = tmp_path / "98_q.py"
    path.write_text(QUESTIONS)
    c = counts.count(path)
    assert c.answers == (0, 0, 0, 2, 0)
    assert c.shortest == 2 and c.longest == 1  # a and b the shortest; e's f-string, measured as written, the longest
    assert counts.course_problems([c]) == [
        "position 0 holds 4 of 5 right answers (at most 40%)",
        "the right answer is the shortest choice in 2 of 5 questions (at most a third)"]
    assert "strictly the shortest: 2 of 5 (40%)" in counts.question_shares([c])


def test_the_exercises_questions_count_with_the_notebooks(tmp_path, capsys):
    (tmp_path / "exercises").mkdir()
    (tmp_path / "99_test.py").write_text(NOTEBOOK)
    (tmp_path / "exercises" / "99_test_exercises.py").write_text(QUESTIONS)
    assert counts.main([str(tmp_path)]) == 0  # without --check it only reports
    out = capsys.readouterr().out
    assert "99_test_exercises" in out and "(7 questions, notebooks and exercises)" in out
    assert "strictly the shortest: 2 of 7 (29%)" in out
    assert counts.main(["--check", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "over budget: position 0 holds 5 of 7" in out and "99_test_exercises:" not in out  # no notebook budget


def test_the_script_reads_every_notebook_of_the_course(capsys):
    assert counts.main([]) == 0
    out = capsys.readouterr().out
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")):
        assert path.stem in out
    for path in sorted((ROOT / "notebooks" / "exercises").glob("[0-9][0-9]_*.py")):
        assert path.stem in out
    assert "right-answer positions" in out and "strictly the shortest:" in out


def test_the_header_states_at_least_the_reading_time(tmp_path):
    """Words at 180 a minute and code at 15 lines a minute: the test notebook's 2 lines of code and its words
    take 1 minute, within its stated 5; stated 0 minutes, the check names both numbers."""
    path = tmp_path / "99_test.py"
    path.write_text(NOTEBOOK)
    c = counts.count(path)
    assert (c.code_lines, c.stated_minutes, c.reading_minutes) == (2, 5, 1)
    assert not any("minutes" in p for p in c.problems())
    path.write_text(NOTEBOOK.replace("about 5 minutes", "about 0 minutes"))
    late = counts.count(path)
    said = f"the header says 0 minutes of reading; its {late.words:,} words and 2 lines of code take 1"
    assert said in late.problems()


def test_every_notebook_meets_the_course_budgets(capsys):
    """Issue 29's budgets, held: words, sentences, bullets, worked problems, the header, answer positions, and
    the right answer neither the longest nor the shortest choice by habit (notebooks and exercises together)."""
    status = counts.main(["--check"])
    out = capsys.readouterr().out
    assert status == 0, "\n".join(line for line in out.splitlines() if line.startswith("over budget"))
