"""The nbgrader course, generated: one assignment per exercise notebook, the answers in its solution cells.

    python scripts/course.py source    write course/source/<assignment>/<exercise notebook>.ipynb (one source of truth:
                                       notebooks/exercises/*_exercises.ipynb and solutions/exercise_answers.py)
    python scripts/course.py check     fail if course/source is not what ``source`` would write
    python scripts/course.py release   ``source``, then every assignment into course/release/ and the course's
                                       exchange, course/exchange/ (make assignments)
    python scripts/course.py grade     autograde course/submitted/<student>/<assignment>/, write the HTML feedback
                                       into course/feedback/ and the gradebook to course/grades.csv (make grade)
    python scripts/course.py grade-one NOTEBOOK --student NAME --out DIR
                                       grade one notebook in a course of its own (GitHub Classroom's workflow):
                                       a released one, or the exercise notebook a student filled in

An assignment is named as its exercise notebook without ``_exercises`` (``08_data_parallel``) and holds that
notebook, under its own name. In it, each function (or class) the learner writes is an nbgrader solution cell
whose ``grade_id`` is the function's name: its ``raise NotImplementedError(...)`` lines are replaced by the
instructor's answer between ``### BEGIN SOLUTION`` and ``### END SOLUTION`` (``nbgrader generate_assignment``
puts a raise back).
Each call of a grader becomes graded test cells: per pool of ranks it is given (2 ranks, 4 ranks ...), one per
property the grader checks (``shardlib.exercises.result.checks``: the values, then the bytes ...), each worth
its points and failing under the grader's message. The questions stay ungraded.

Release and grading go through nbgrader's own API (``NbGraderAPI``) in this process, one submission at a time,
after a check that names what keeps a submission from its marks (``submissions``).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
EXERCISES = ROOT / "notebooks" / "exercises"
SOLUTIONS = ROOT / "solutions"
ANSWERS = SOLUTIONS / "exercise_answers.py"
COURSE = ROOT / "course"
SOURCE = COURSE / "source"
POINTS_PER_CHECK = 1
SANDBOX = ROOT / "scripts" / "sandbox_kernel.py"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def assignment_name(exercise: Path) -> str:
    """``08_data_parallel_exercises.ipynb`` -> ``08_data_parallel``."""
    return exercise.stem.removesuffix("_exercises")


def _grader_calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id.startswith("grade_")]


def answer_names(exercise: Path) -> dict[str, str]:
    """The learner's names (``pair_forward``) -> the answers' (``tp_pair_forward``), read from the grader
    calls of the exercise and of its solution notebook, argument by argument."""
    solution = SOLUTIONS / exercise.name.replace("_exercises", "_solutions")
    learner = {c.func.id: c.args for c in _grader_calls(ast.parse(exercise.with_suffix(".py").read_text()))}
    answer = {c.func.id: c.args for c in _grader_calls(ast.parse(solution.with_suffix(".py").read_text()))}
    names = {}
    for grader, args in learner.items():
        if grader not in answer:
            raise SystemExit(f"{solution.name} does not run {grader}, which {exercise.name} runs")
        for mine, theirs in zip(args, answer[grader]):
            if isinstance(theirs, ast.Attribute) and getattr(theirs.value, "id", "") == "answers":
                names[mine.id] = theirs.attr
    return names


def _body_source(lines: list[str], fn: ast.FunctionDef) -> str:
    """A function's body without its docstring, dedented."""
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    return textwrap.dedent("\n".join(lines[body[0].lineno - 1:body[-1].end_lineno]))


def _signature(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Raise) and isinstance(stmt.exc, ast.Call)
            and getattr(stmt.exc.func, "id", "") == "NotImplementedError")


def _without_imports_in(body: str, present: set[str]) -> str:
    """``body`` without the import lines it opens with that the cell already has (and the blank line after
    them, when none is left)."""
    lines = body.split("\n")
    n = next(i for i, line in enumerate(lines) if not re.match(r"(from \S+ )?import ", line))
    kept = [line for line in lines[:n] if line.strip() not in present]
    rest = lines[n + 1:] if not kept and n and lines[n] == "" else lines[n:]
    return "\n".join(kept + rest)


def with_answers(code: str, names: dict[str, str], answers: dict[str, ast.AST], answer_lines: list[str]) -> tuple[
        str, list[str]]:
    """The cell's code with each ``raise NotImplementedError`` replaced by the answer between the markers,
    and the names of the functions and classes it filled."""
    tree, lines = ast.parse(code), code.split("\n")
    swaps, filled = [], []  # (first line, last line, indent, answer body)
    for top in tree.body:
        if not isinstance(top, (ast.FunctionDef, ast.ClassDef)) or top.name not in names:
            continue
        theirs = answers[names[top.name]]
        if isinstance(top, ast.FunctionDef):
            pairs = [(top, theirs)]
        else:
            methods = {m.name: m for m in theirs.body if isinstance(m, ast.FunctionDef)}
            pairs = [(m, methods[m.name]) for m in top.body if isinstance(m, ast.FunctionDef)
                     and any(_raises_not_implemented(s) for s in m.body)]
        for mine, answer in pairs:
            if _signature(mine) != _signature(answer):
                raise SystemExit(f"{top.name}.{mine.name}: the starter takes {_signature(mine)} but the answer "
                                 f"takes {_signature(answer)}; make them agree")
            for stmt in mine.body:
                if _raises_not_implemented(stmt):
                    swaps.append((stmt.lineno, stmt.end_lineno, stmt.col_offset, _body_source(answer_lines, answer)))
        if pairs:
            filled.append(top.name)
    present = {line.split("#")[0].strip() for line in lines}
    for first, last, indent, body in sorted(swaps, reverse=True):
        body = _without_imports_in(body, present)
        pad = " " * indent
        lines[first - 1:last] = [pad + BEGIN] + textwrap.indent(body, pad).split("\n") + [pad + END]
    return "\n".join(lines), filled


def _size(call: ast.AST) -> int | None:
    """``n`` of a ``Ranks(n)`` call, or None when the expression is something else."""
    if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Ranks" and call.args:
        return ast.literal_eval(call.args[0])
    return None


def _pools(nb) -> dict[str, int]:
    """Names the notebook binds to a ``Ranks(n)`` pool, with their ``n`` (``ranks``: 2, ``four``: 4)."""
    pools = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for node in ast.walk(ast.parse(cell.source)):
            targets = []
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
                values = value.elts if isinstance(value, ast.Tuple) else [value]
                names = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
                pools |= {n.id: _size(v) for n, v in zip(names, values) if _size(v) and isinstance(n, ast.Name)}
            elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
                if _size(node.context_expr):
                    pools[node.optional_vars.id] = _size(node.context_expr)
    return pools


def grader_checks(name: str, code: str) -> dict[str, int]:
    """The properties grader ``name`` checks and their points (``shardlib.exercises.result.checks``), found by
    running the cell's own ``from shardlib.exercises... import`` lines."""
    scope: dict = {}
    for node in ast.parse(code).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardlib.exercises"):
            exec(compile(ast.Module([node], []), "<cell>", "exec"), scope)
    return getattr(scope[name], "checks", {"answer": POINTS_PER_CHECK})


def test_cells(code: str, pools: dict[str, int]) -> list[tuple[str, str, int]]:
    """A grader cell as graded test cells ``(what it checks, code, points)``: per pool the grader is given, one
    cell that runs it (the grader's message is the feedback) and asserts its first property, then one cell
    per further property."""
    tree, lines = ast.parse(code), code.split("\n")
    call = _grader_calls(tree)[0]
    stmt = next(s for s in ast.walk(tree) if isinstance(s, (ast.Expr, ast.Assign)) and s.value is call)
    checks = grader_checks(call.func.id, code)
    on = [a.id for a in call.args if isinstance(a, ast.Name) and a.id in pools] or [None]
    cells = []
    for pool in on:
        args = [ast.unparse(a) for a in call.args if pool is None or not (isinstance(a, ast.Name) and a.id in pools)
                or a.id == pool]
        pad = " " * stmt.col_offset
        run = lines[:stmt.lineno - 1] + [pad + f"result = {call.func.id}({', '.join(args)})"] + lines[stmt.end_lineno:]
        run = [line for line in run if line.strip() != "result"] + ["display(result)"]  # shown once, below
        where = call.func.id.removeprefix("grade_") + (f" on {pools[pool]} ranks" if pool else "")
        for i, (check, points) in enumerate(checks.items()):
            test = f"assert result.holds({check!r}), \"{where}: {check} does not hold (the checker says why above)\""
            cells.append((f"{where}: {check}", "\n".join((run if i == 0 else []) + [test]).strip(), points))
    return cells


def nbgrader_meta(grade_id: str, solution: bool, grade: bool, points: int = 0) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if grade:
        meta["points"] = points
    return meta


def _imported(tree: ast.AST) -> set[str]:
    """The names import statements bind in ``tree``."""
    return {(a.asname or a.name).split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names}


def _check_imports(exercise: Path, cells, answers_tree: ast.AST) -> None:
    """Every module-level import of the answers that a solution uses is imported by the notebook before it."""
    module_imports = _imported(ast.Module([n for n in answers_tree.body if isinstance(n, (ast.Import, ast.ImportFrom))],
                                          []))
    seen: set[str] = set()
    for cell in cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        seen |= _imported(tree)
        if cell.metadata.get("nbgrader", {}).get("solution"):
            used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
            missing = (used & module_imports) - seen
            if missing:
                raise SystemExit(f"{exercise.name}: the answer in {cell.metadata['nbgrader']['grade_id']} uses "
                                 f"{sorted(missing)}, which the notebook never imports: import it in the starter")


def source_notebook(exercise: Path) -> nbformat.NotebookNode:
    """The exercise notebook with its answers in solution cells and its graders as test cells."""
    nb = nbformat.read(exercise, as_version=4)
    answer_text = ANSWERS.read_text()
    answers = {n.name: n for n in ast.parse(answer_text).body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names, pools = answer_names(exercise), _pools(nb)
    cells, seen_ids = [], set()
    for cell in nb.cells:
        cell = copy.deepcopy(cell)
        if cell.cell_type == "markdown":  # fetched, the notebook sits in assignments/<assignment>/
            cell.source = cell.source.replace("](../", "](../../notebooks/")
        if cell.cell_type == "code" and "NotImplementedError(" in cell.source and names.keys() & set(
                re.findall(r"^(?:def|class) (\w+)", cell.source, flags=re.M)):
            cell.source, filled = with_answers(cell.source, names, answers, answer_text.split("\n"))
            if filled:
                cell.metadata["nbgrader"] = nbgrader_meta(filled[0], solution=True, grade=False)
                seen_ids.add(filled[0])
        if cell.cell_type == "code" and _grader_calls(ast.parse(cell.source)):
            for what, code, points in test_cells(cell.source, pools):
                grade_id = "check_" + re.sub(r"\W+", "_", what).strip("_")
                if grade_id in seen_ids:
                    raise SystemExit(f"{exercise.name}: two test cells would be {grade_id}")
                seen_ids.add(grade_id)
                test = nbformat.v4.new_code_cell(code, id=grade_id.replace("_", "-"))
                test.metadata["nbgrader"] = nbgrader_meta(grade_id, solution=False, grade=True, points=points)
                test.metadata["tags"] = cell.metadata.get("tags", [])
                cells.append(test)
            continue
        cells.append(cell)
    missing = set(names) - seen_ids
    if missing:
        raise SystemExit(f"{exercise.name}: no solution cell for {sorted(missing)}")
    _check_imports(exercise, cells, ast.parse(answer_text))
    nb.cells = cells
    return nb


def written() -> dict[Path, str]:
    """Every source notebook, by path, as ``source`` writes it."""
    out = {}
    for exercise in sorted(EXERCISES.glob("*_exercises.ipynb")):
        name = assignment_name(exercise)
        nb = source_notebook(exercise)
        out[SOURCE / name / exercise.name] = json.dumps(nb, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    return out


def sandbox_command(course: Path) -> list[str]:
    """The command that starts a grading kernel in the sandbox (``scripts/sandbox_kernel.py``): the course, the
    repository, this Python and the home folder read-only, the students' folders and the gradebook hidden.
    A path holding /tmp stays writable (the ranks need it)."""
    tmp = Path(tempfile.gettempdir()).resolve()
    paths = {p.resolve() for p in (ROOT, Path(sys.prefix), Path(sys.base_prefix), Path.home())}
    protect = sorted(p for p in paths if not tmp.is_relative_to(p)
                     and not any(p != q and p.is_relative_to(q) for q in paths))  # a folder inside another: once
    return ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", sys.executable,
            str(SANDBOX), "--course", str(course), *[a for p in protect for a in ("--protect", str(p))]]


def sandbox_problem(course: Path) -> str | None:
    """Why submissions cannot be sandboxed here, in words; None where they can (the sandbox is tried once)."""
    missing = [tool for tool in ("unshare", "mount", "setpriv") if not shutil.which(tool)]
    if sys.platform != "linux" or missing:
        return f"the sandbox needs Linux and util-linux's unshare, mount and setpriv (missing: {missing or 'Linux'})"
    done = subprocess.run([*sandbox_command(course), "--probe"], capture_output=True, text=True, timeout=120)
    (course / "sandbox-probe").unlink(missing_ok=True)  # written only where the sandbox failed to hold
    if done.returncode:
        why = done.stderr.strip().splitlines() or ["the course stayed writable from inside it"]
        return f"the sandbox did not hold on this machine: {why[-1]}"
    return None


def sandbox_kernel(course: Path, folder: Path) -> str:
    """A kernel spec, written into ``folder`` and put on Jupyter's path, whose kernels run in the sandbox;
    returns its name."""
    spec = folder / "kernels" / "grading-sandbox"
    spec.mkdir(parents=True)
    argv = [*sandbox_command(course), "--", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3 (grading sandbox)",
                                                  "language": "python"}))
    os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(folder), os.environ.get("JUPYTER_PATH")]))
    return spec.name


def nbgrader_api(course: Path, kernel: str | None = None):
    """nbgrader's own API on ``course``, its settings read from ``course/nbgrader_config.py``, in this process
    (one import of nbgrader instead of one per command), its notebooks run in ``kernel`` if given. A release
    replaces an earlier one."""
    bin_dir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")  # nbgrader runs alembic by name
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    config.ExchangeReleaseAssignment.force = True
    if kernel:
        config.Execute.kernel_name = kernel
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def done(result: dict, what: str) -> bool:
    """Whether nbgrader's call succeeded; if not, say what failed and print its log."""
    if not result["success"]:
        print(f"nbgrader could not {what}:\n{result.get('error') or result.get('log', '')}", file=sys.stderr)
    return result["success"]


def assignments(course: Path) -> list[str]:
    return sorted(p.name for p in (course / "source").iterdir() if p.is_dir())


def release(course: Path = COURSE) -> list[str]:
    """Every assignment of ``course/source`` into ``course/release`` (nbgrader's generate_assignment), and into
    the course's exchange (release_assignment), where JupyterLab's Assignments tab lists it."""
    names, api = assignments(course), nbgrader_api(course)
    (course / "exchange").mkdir(exist_ok=True)
    for name in names:
        if not (done(api.generate_assignment(name, force=True), f"generate {name}")
                and done(api.release_assignment(name), f"release {name} into the exchange")):
            raise SystemExit(f"{name} was not released: see nbgrader's log above")
    return names


def _problems(path: Path, source: Path) -> list[str]:
    """What stands between a handed-in notebook and its grade, in words: not a notebook, a solution cell
    deleted (its ``grade_id`` gone) or the function in it renamed."""
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported, not raised
        return [f"{path.name} is not a notebook nbgrader can read ({type(exc).__name__}: {str(exc)[:80]}): "
                "left out of the grading (it scores 0); ask for it again"]
    mine = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in nb.cells if c.cell_type == "code"}
    found = []
    for cell in nbformat.read(source, as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("solution"):
            continue
        name = meta["grade_id"]
        if name not in mine:
            found.append(f"the cell where {name} is written is gone (deleted, or its nbgrader metadata changed): "
                         "the checks of it score 0")
        elif not re.search(rf"^\s*(?:def|class) {name}\b", mine[name], flags=re.M):
            found.append(f"its cell no longer defines {name} (renamed?): the checks of it score 0")
    return found


def submissions(course: Path) -> tuple[dict[str, list[str]], list[str]]:
    """Assignment -> the students whose notebooks can be graded, and what is wrong with the others, checked
    first: an unknown assignment stops us; a missing or unreadable notebook is named and left out (it scores
    0); a deleted solution cell or a renamed function is named, and graded as it is."""
    found: dict[str, list[str]] = {}
    notes: list[str] = []
    for folder in sorted((course / "submitted").glob("*/*")):
        student, name = folder.parent.name, folder.name
        if name not in assignments(course):
            raise SystemExit(f"{folder.relative_to(course)}: there is no assignment {name!r} "
                             f"(the assignments: {', '.join(assignments(course))})")
        where = f"{student}, {name}"
        fatal = False
        for source in (course / "source" / name).glob("*.ipynb"):
            handed = folder / source.name
            if not handed.is_file():
                notes.append(f"{where}: {source.name} is missing: it scores 0 until it is handed in")
                fatal = True  # nothing to grade: the gradebook lists the student at 0
                continue
            problems = _problems(handed, source)
            fatal |= any("not a notebook" in p for p in problems)
            notes += [f"{where}: {p}" for p in problems]
        if not fatal:
            found.setdefault(name, []).append(student)
    return found, notes


def grade(course: Path = COURSE) -> Path:
    """Autograde every submission, write its feedback and export the gradebook to ``course/grades.csv``;
    print what kept any submission from its full grade before grading it."""
    handed_in, notes = submissions(course)
    for note in notes:
        print(note, file=sys.stderr)
    if not handed_in:
        raise SystemExit(f"nothing to grade: put each notebook at {course.name}/submitted/<student>/<assignment>/")
    problem = sandbox_problem(course)
    if problem:
        print(f"the submissions run unsandboxed, with your rights: {problem}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as kernels:
        return _grade(course, handed_in, None if problem else sandbox_kernel(course, Path(kernels)))


def _grade(course: Path, handed_in: dict[str, list[str]], kernel: str | None) -> Path:
    api = nbgrader_api(course, kernel)
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    with Gradebook(api.coursedir.db_url) as gradebook:
        known = {a.name for a in gradebook.assignments}
        for student in (s.name for s in (course / "submitted").iterdir() if s.is_dir()):
            gradebook.update_or_create_student(student)  # so grades.csv lists one with nothing gradable, at 0
    for name in sorted(set(handed_in) - known):  # graded before it was released here: generate it first
        done(api.generate_assignment(name, force=True), f"generate {name}")
    failed = []
    for name, students in handed_in.items():
        for student in students:  # one at a time: a submission nbgrader cannot grade never stops the others
            if not (done(api.autograde(name, student, force=True, create=True), f"grade {student}, {name}")
                    and done(api.generate_feedback(name, student, force=True), f"write {student}'s feedback")):
                failed.append(f"{student}, {name}")
    with Gradebook(api.coursedir.db_url) as gradebook:
        CsvExportPlugin(config=api.config, to=str(course / "grades.csv")).export(gradebook)
    if failed:
        raise SystemExit(f"not graded (see nbgrader's log above): {'; '.join(failed)}")
    return course / "grades.csv"


def adopt(handed: dict, source: Path) -> dict:
    """A notebook without nbgrader's metadata (the exercise notebook, filled in) as a submission: the released
    cells, each solution cell's code taken from the student's cell that defines the same function or class."""
    theirs = {}
    for cell in handed["cells"]:
        if cell["cell_type"] == "code":
            for name in re.findall(r"^(?:def|class) (\w+)", "".join(cell["source"]), flags=re.M):
                theirs.setdefault(name, "".join(cell["source"]))
    nb = nbformat.read(source, as_version=4)
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and meta["grade_id"] in theirs:
            cell.source = theirs[meta["grade_id"]]
    return json.loads(nbformat.writes(nb))


def grade_one(notebook: Path, student: str, out: Path) -> Path:
    """Grade one notebook in a throwaway course: its assignment found by the notebook's file name; the grades
    and the feedback copied to ``out``."""
    import tempfile

    matches = [p for p in SOURCE.glob(f"*/{notebook.name}")]
    if not matches:
        raise SystemExit(f"{notebook.name} is not an assignment's notebook: the assignments' notebooks are "
                         f"{', '.join(p.name for p in sorted(SOURCE.glob('*/*.ipynb')))}")
    source, name = matches[0], matches[0].parent.name
    handed = json.loads(notebook.read_text())
    if not any(c.get("metadata", {}).get("nbgrader") for c in handed.get("cells", [])):
        handed = adopt(handed, source)
    with tempfile.TemporaryDirectory() as tmp:
        course = Path(tmp)
        shutil.copy(COURSE / "nbgrader_config.py", course)
        shutil.copytree(source.parent, course / "source" / name)
        folder = course / "submitted" / student / name
        folder.mkdir(parents=True)
        (folder / notebook.name).write_text(json.dumps(handed))
        grades = grade(course)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(grades, out / "grades.csv")
        for page in (course / "feedback" / student / name).glob("*.html"):
            shutil.copy(page, out / page.name)
    return out / "grades.csv"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("source", "check", "release", "grade", "grade-one"))
    parser.add_argument("notebook", type=Path, nargs="?", help="grade-one: the notebook to grade")
    parser.add_argument("--course", type=Path, default=COURSE, help="the course directory (default: course/)")
    parser.add_argument("--student", default="student", help="grade-one: the student's name in grades.csv")
    parser.add_argument("--out", type=Path, default=Path("graded"), help="grade-one: where grades and feedback go")
    args = parser.parse_args(argv)
    if args.command == "grade-one":
        if args.notebook is None or not args.notebook.is_file():
            parser.error(f"grade-one needs a notebook file, got {args.notebook}")
        grades = grade_one(args.notebook.resolve(), args.student, args.out.resolve())
        for row in grades.read_text().splitlines()[1:]:
            cells = row.split(",")
            print(f"{cells[3]}, {cells[0]}: {cells[9]} of {cells[10]} points (feedback in {args.out})")
        return 0
    if args.command == "grade":
        print(f"wrote {grade(args.course.resolve())}")
        return 0
    wanted = written()
    if args.command == "check":
        stale = [p for p, text in wanted.items() if not p.exists() or p.read_text() != text]
        extra = [p for p in SOURCE.glob("*/*.ipynb") if p not in wanted]
        for p in stale + extra:
            print(f"{p.relative_to(ROOT)} is out of date: run python scripts/course.py source", file=sys.stderr)
        return 1 if stale or extra else 0
    for p in SOURCE.glob("*/*.ipynb"):
        if p not in wanted:
            p.unlink()
    for p, text in wanted.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    print(f"wrote {len(wanted)} source notebooks under {SOURCE.relative_to(ROOT)}")
    if args.command == "release":
        names = release(args.course.resolve())
        print(f"released {len(names)} assignments under {args.course / 'release'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
