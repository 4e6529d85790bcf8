"""What a learner meets in each notebook, counted: words, sentences, questions, worked problems.

    .venv/bin/python scripts/course_counts.py            # a table, one row per notebook
    .venv/bin/python scripts/course_counts.py --check    # and exit 1 where a notebook passes a budget

Counted on the jupytext source (``notebooks/NN_name.py``), in the markdown cells, outside ``<details>``
blocks (folded text does not count) and outside tables, headings and HTML lines:

* words, sentences, their mean length and how many run past 40 words;
* the bullets under "What you will see";
* the check-yourself questions (``Question(prompt, choices, answer, ...)`` calls): how many, the
  position of each right answer, and how often the right answer is strictly the longest choice, and
  strictly the shortest (a tie is neither), measured in the characters a learner reads. The exercise
  notebooks' questions (``notebooks/exercises/NN_*.py``) count with them: a habit must not win there either;
* worked problems: headings or bold labels that say "Worked problem" (a heading "Worked problems" over them is not one);
* the header: a quoted line under the title naming the part, the notebooks assumed, the reading time and
  what the notebook trades (``> **Part I ...** Assumes: ... Reading time: ... Trades: ...``).

The budgets ``--check`` holds: at most 2,500 visible words, a mean sentence under 22 words, none over 40,
3 to 6 bullets under "What you will see", at least two worked problems, the header, its reading time at least the
visible words at 180 a minute plus the code's non-blank lines at 15 a minute; across the course's questions
(notebooks and exercises), no answer position holding more than 40 % of them, the right answer strictly the longest
choice in at most a third and strictly the shortest in at most a third.
"""

from __future__ import annotations

import argparse
import ast
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_WORDS, MAX_MEAN_SENTENCE, MAX_SENTENCE = 2500, 22, 40
BULLETS = (3, 6)
MIN_WORKED = 2
MAX_POSITION_SHARE, MAX_LONGEST_SHARE, MAX_SHORTEST_SHARE = 0.4, 1 / 3, 1 / 3
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE = 180, 15
WORD = re.compile(r"[A-Za-z0-9][\w'-]*")


@dataclass(frozen=True)
class Counts:
    notebook: str
    words: int
    sentences: int
    long_sentences: int
    bullets_seen: int
    worked_problems: int
    answers: tuple[int, ...]  # the right answer's position, per question
    longest: int  # questions whose right answer is strictly the longest choice
    shortest: int  # questions whose right answer is strictly the shortest choice
    header: bool = True  # part, assumes, reading time, trades
    code_lines: int = 0  # non-blank lines of the code cells
    stated_minutes: int | None = None  # the header's "Reading time: about N minutes"

    @property
    def mean_sentence_words(self) -> float:
        return self.words / self.sentences if self.sentences else 0.0

    @property
    def reading_minutes(self) -> int:
        """What the notebook takes to read: its visible words at 180 a minute and its code at 15 lines a
        minute, rounded up."""
        return math.ceil(self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE)

    def problems(self) -> list[str]:
        out = []
        if self.words > MAX_WORDS:
            out.append(f"{self.words:,} visible words (at most {MAX_WORDS:,})")
        if self.mean_sentence_words >= MAX_MEAN_SENTENCE:
            out.append(f"sentences of {self.mean_sentence_words:.1f} words on average (under {MAX_MEAN_SENTENCE})")
        if self.long_sentences:
            out.append(f"{self.long_sentences} sentences over {MAX_SENTENCE} words")
        if not BULLETS[0] <= self.bullets_seen <= BULLETS[1]:
            out.append(f"{self.bullets_seen} bullets under 'What you will see' ({BULLETS[0]} to {BULLETS[1]})")
        if self.worked_problems < MIN_WORKED:
            out.append(f"{self.worked_problems} worked problems (at least {MIN_WORKED})")
        if not self.header:
            out.append("no header under the title (> **Part ...** Assumes: ... Reading time: ... Trades: ...)")
        elif self.stated_minutes is None or self.stated_minutes < self.reading_minutes:
            out.append(f"the header says {self.stated_minutes} minutes of reading; its {self.words:,} words and "
                       f"{self.code_lines} lines of code take {self.reading_minutes}")
        return out


HEADER = re.compile(r"^> \*\*(Part I|Part II|Both parts)\b.*Assumes:.*Reading time:.*Trades:", re.M | re.S)


def has_header(cells: list[str]) -> bool:
    """The first markdown cell's quoted header: its part, what it assumes, its reading time, its trade."""
    first = cells[0] if cells else ""
    quoted = " ".join(line[2:] for line in first.splitlines() if line.startswith("> "))
    return bool(HEADER.search("> " + quoted)) if quoted else False


def code_lines(source: str) -> int:
    """The non-blank lines of a jupytext percent file's code cells."""
    n, in_code = 0, False
    for line in source.splitlines():
        if line.startswith("# %%"):
            in_code = "[markdown]" not in line
        elif in_code and line.strip():
            n += 1
    return n


def stated_minutes(cells: list[str]) -> int | None:
    """The header's reading time, in minutes."""
    quoted = " ".join(line[2:] for line in (cells[:1] or [""])[0].splitlines() if line.startswith("> "))
    m = re.search(r"Reading time:\s*about\s+(\d+)\s+minutes", quoted)
    return int(m.group(1)) if m else None


def markdown_cells(source: str) -> list[str]:
    """The text of each markdown cell of a jupytext percent file, the leading ``# `` removed."""
    cells, current, in_markdown = [], [], False
    for line in source.splitlines():
        if line.startswith("# %%"):
            if in_markdown:
                cells.append("\n".join(current))
            current, in_markdown = [], "[markdown]" in line
        elif in_markdown:
            current.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
    if in_markdown:
        cells.append("\n".join(current))
    return cells


def visible_prose(cells: list[str]) -> str:
    """The prose a learner reads unfolded: no ``<details>``, tables, headings or HTML lines."""
    text = re.sub(r"<details>.*?</details>", " ", "\n".join(cells), flags=re.S | re.I)
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(("|", "#", "<")))


def sentences(prose: str) -> list[str]:
    """Sentences: bullets and paragraphs end one; so do ``.``, ``?`` and ``!`` before a space."""
    prose = re.sub(r"`[^`]*`", "x", prose)  # inline code is one word
    parts = []
    for block in re.split(r"\n\s*\n|\n\s*[-*] |\n\s*\d+\. ", "\n" + prose):
        parts += [p for p in re.split(r"(?<=[.?!])\s+(?=[A-Z(\"*`])", " ".join(block.split())) if WORD.search(p)]
    return parts


def bullets_seen(cells: list[str]) -> int:
    """Bullets in the "What you will see" part of the notebook (until the next heading or blank run)."""
    text = "\n".join(cells)
    m = re.search(r"what you will see[^\n]*\n(.*?)(\n#|\n\s*\n\s*\n|\Z)", text, flags=re.S | re.I)
    if not m:
        return 0
    return sum(1 for line in m.group(1).splitlines() if re.match(r"\s*[-*] ", line))


def shown_length(choice: ast.expr) -> int:
    """The characters a learner reads: a string's own, else the expression's source."""
    if isinstance(choice, ast.Constant) and isinstance(choice.value, str):
        return len(choice.value)
    return len(ast.unparse(choice))


def questions(source: str) -> tuple[tuple[int, ...], int, int]:
    """Each ``Question(...)``'s right-answer position (in the order they appear), and how many have the right
    choice strictly the longest, and strictly the shortest (a tie is neither)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return (), 0, 0
    answers, longest, shortest = [], 0, 0
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Question"]
    for node in sorted(calls, key=lambda n: (n.lineno, n.col_offset)):
        kw = {k.arg: k.value for k in node.keywords}
        choices = kw.get("choices", node.args[1] if len(node.args) > 1 else None)
        answer = kw.get("answer", node.args[2] if len(node.args) > 2 else None)
        if not (isinstance(answer, ast.Constant) and isinstance(choices, (ast.Tuple, ast.List))):
            continue
        lengths = [shown_length(e) for e in choices.elts]
        answers.append(answer.value)
        if isinstance(answer.value, int) and 0 <= answer.value < len(lengths):
            right, others = lengths[answer.value], lengths[:answer.value] + lengths[answer.value + 1:]
            longest += bool(others) and right > max(others)
            shortest += bool(others) and right < min(others)
    return tuple(answers), longest, shortest


def count(path: Path) -> Counts:
    source = path.read_text()
    cells = markdown_cells(source)
    prose = visible_prose(cells)
    found = sentences(prose)
    worked = len(re.findall(r"(^#+[^\n]*worked problem(?!s)|\*\*worked problem(?!s))", "\n".join(cells),
                            flags=re.I | re.M))
    answers, longest, shortest = questions(source)
    return Counts(path.stem, len(WORD.findall(prose)), len(found),
                  sum(1 for s in found if len(WORD.findall(s)) > MAX_SENTENCE), bullets_seen(cells), worked,
                  answers, longest, shortest, has_header(cells), code_lines(source), stated_minutes(cells))


def question_shares(rows: list[Counts]) -> str:
    """One line: how often the right answer is strictly the longest choice, and strictly the shortest."""
    n = sum(len(r.answers) for r in rows)
    longest, shortest = sum(r.longest for r in rows), sum(r.shortest for r in rows)
    return (f"right answer strictly the longest choice: {longest} of {n} ({longest / max(n, 1):.0%}); "
            f"strictly the shortest: {shortest} of {n} ({shortest / max(n, 1):.0%}); at most a third each")


def course_problems(rows: list[Counts]) -> list[str]:
    answers = [a for r in rows for a in r.answers]
    if not answers:
        return []
    out = []
    top = max(set(answers), key=answers.count)
    if answers.count(top) > MAX_POSITION_SHARE * len(answers):
        out.append(f"position {top} holds {answers.count(top)} of {len(answers)} right answers "
                   f"(at most {MAX_POSITION_SHARE:.0%})")
    longest = sum(r.longest for r in rows)
    if longest > MAX_LONGEST_SHARE * len(answers):
        out.append(f"the right answer is the longest choice in {longest} of {len(answers)} questions (at most a third)")
    shortest = sum(r.shortest for r in rows)
    if shortest > MAX_SHORTEST_SHARE * len(answers):
        out.append(f"the right answer is the shortest choice in {shortest} of {len(answers)} questions "
                   f"(at most a third)")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where a notebook passes a budget")
    parser.add_argument("folder", nargs="?", default=str(ROOT / "notebooks"))
    args = parser.parse_args(argv)
    rows = [count(p) for p in sorted(Path(args.folder).glob("[0-9][0-9]_*.py"))]
    exercises = [count(p) for p in sorted((Path(args.folder) / "exercises").glob("[0-9][0-9]_*.py"))]
    print(f"{'notebook':<34}{'words':>7}{'sent.':>7}{'mean':>6}{'>40':>5}{'seen':>6}{'worked':>8}{'questions':>11}"
          f"{'longest':>9}{'shortest':>10}{'code':>6}{'min':>5}{'says':>6}")
    for r in rows:
        print(f"{r.notebook:<34}{r.words:>7,}{r.sentences:>7}{r.mean_sentence_words:>6.1f}{r.long_sentences:>5}"
              f"{r.bullets_seen:>6}{r.worked_problems:>8}{len(r.answers):>11}{r.longest:>9}{r.shortest:>10}"
              f"{r.code_lines:>6}{r.reading_minutes:>5}{r.stated_minutes or '-':>6}")
    for r in exercises:  # only their questions are counted: the budgets above are the main notebooks'
        print(f"{r.notebook:<34}{'':>39}{len(r.answers):>11}{r.longest:>9}{r.shortest:>10}")
    answers = [a for r in rows + exercises for a in r.answers]
    print(f"right-answer positions ({len(answers)} questions, notebooks and exercises): "
          + ", ".join(f"{p}: {answers.count(p)} ({answers.count(p) / len(answers):.0%})" for p in sorted(set(answers))))
    print(question_shares(rows + exercises))
    problems = [f"{r.notebook}: {p}" for r in rows for p in r.problems()] + course_problems(rows + exercises)
    for p in problems:
        print(f"over budget: {p}")
    return 1 if args.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
