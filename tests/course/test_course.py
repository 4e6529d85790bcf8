"""The nbgrader course end to end: the source notebooks are up to date, every exercise is released, and three
submissions per assignment (right, a named mistake, the untouched starter) are autograded on live ranks into
grades.csv and feedback, leaving no process behind."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "course.py"
STUB = 'raise NotImplementedError("write your code here")'


def _course_module():
    spec = importlib.util.spec_from_file_location("course_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


course_script = _course_module()


def test_the_source_notebooks_are_up_to_date():
    done = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_every_exercise_is_an_assignment_with_its_answers_in_solution_cells():
    exercises = sorted(p.stem.removesuffix("_exercises") for p in (ROOT / "notebooks/exercises").glob("*.ipynb"))
    assert course_script.assignments(ROOT / "course") == exercises
    for name in exercises:
        (path,) = (ROOT / "course/source" / name).glob("*.ipynb")
        cells = [c["metadata"].get("nbgrader") for c in json.loads(path.read_text())["cells"]]
        solutions = [m["grade_id"] for m in cells if m and m["solution"]]
        tests = [m for m in cells if m and m["grade"]]
        assert solutions and len(tests) >= 2, f"{name}: solution cells {solutions}, {len(tests)} graded test cells"
        assert all(m["points"] >= 1 for m in tests)


def _copy_course(tmp_path: Path, name: str) -> Path:
    course = tmp_path / "course"
    (course / "source").mkdir(parents=True)
    shutil.copy(ROOT / "course" / "nbgrader_config.py", course)
    shutil.copytree(ROOT / "course" / "source" / name, course / "source" / name)
    return course


def _hand_in(course: Path, student: str, name: str, notebook: dict) -> None:
    folder = course / "submitted" / student / name
    folder.mkdir(parents=True)
    (path,) = (course / "release" / name).glob("*.ipynb")
    (folder / path.name).write_text(json.dumps(notebook))


def _with_bodies(released: dict, grade_id: str, bodies: tuple[str, ...]) -> dict:
    """The released notebook with the stubs of solution cell ``grade_id`` replaced by ``bodies``, in order."""
    notebook = json.loads(json.dumps(released))
    cell = next(c for c in notebook["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    source = "".join(cell["source"])
    assert source.count(STUB) == len(bodies), source
    for body in bodies:
        indent = source[:source.index(STUB)].rsplit("\n", 1)[1]
        source = source.replace(STUB, textwrap.indent(textwrap.dedent(body).strip(), indent).lstrip(), 1)
    cell["source"] = source
    return notebook


def _sessions_alive(sid: int) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "sid=,pid=,args="], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if line.split(None, 1)[0] == str(sid)]


# assignment, the learner's function (or class), a mistake (a body per stub), the text its feedback must name, and
# the mistake's score out of the right answer's
CASES = [
    # right on 2 and 4 ranks, but DDP's all-reduce where a reduce-scatter would do: the values' points, not the bytes'
    ("08_data_parallel", "zero1_step", ("""
        n, r = ctx.world_size, ctx.rank
        total = ctx.comm.all_reduce(grads)
        updated = optimizer(params.chunk(n)[r], total.chunk(n)[r])
        return ctx.comm.all_gather(updated)
        """,), "an all-reduce hands every rank the whole summed gradient", (4, 6)),
    # blocks handed out and given back, but no prefix is ever reused
    ("06_serving_engine", "MyBlockManager", ("""
        table = [self.free_blocks.pop(0) for _ in range(-(-len(tokens) // self.block_size))]
        for block in table:
            self.refs[block] = 1
        self.tables[seq] = table
        return 0
        """, """
        pass
        """, """
        for block in reversed(self.tables.pop(seq)):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self.free_blocks.append(block)
        """), "found 0 cached tokens", (1, 4)),
    # the right output and max, but the sum left measured from the old maxes
    ("10_context_parallel", "merge_partials", ("""
        new_max = torch.maximum(max_a, max_b)
        w_a, w_b = sum_a * torch.exp(max_a - new_max), sum_b * torch.exp(max_b - new_max)
        out = (w_a.unsqueeze(-1) * out_a + w_b.unsqueeze(-1) * out_b) / (w_a + w_b).unsqueeze(-1)
        return out, new_max, sum_a + sum_b
        """,), "out and max are right but sum is not", (3, 4)),
]


@pytest.mark.parametrize("name, grade_id, mistake, named, scores", CASES, ids=[c[0] for c in CASES])
def test_an_assignment_is_released_handed_in_and_graded(tmp_path, name, grade_id, mistake, named, scores):
    """The right answer gets every point, the mistake some (its feedback naming it), the starter none."""
    course = _copy_course(tmp_path, name)
    assert course_script.release(course) == [name]
    (released_path,) = (course / "release" / name).glob("*.ipynb")
    released = json.loads(released_path.read_text())
    (source_path,) = (course / "source" / name).glob("*.ipynb")
    code = "".join("".join(c["source"]) for c in released["cells"])
    assert "BEGIN SOLUTION" not in code and STUB in code

    _hand_in(course, "right", name, json.loads(source_path.read_text()))
    _hand_in(course, "mistake", name, _with_bodies(released, grade_id, mistake))
    _hand_in(course, "starter", name, released)
    grading = subprocess.Popen([sys.executable, str(SCRIPT), "grade", "--course", str(course)],
                               start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = grading.communicate(timeout=900)
    assert grading.returncode == 0, out
    assert _sessions_alive(grading.pid) == [], "a rank or kernel outlived the grading"

    rows = {r["student_id"]: r for r in csv.DictReader((course / "grades.csv").open())}
    got = {student: (float(r["score"]), float(r["max_score"])) for student, r in rows.items()}
    mistake_score, total = scores
    assert got == {"right": (total, total), "mistake": (mistake_score, total), "starter": (0.0, total)}
    feedback = (course / "feedback" / "mistake" / name / released_path.name).with_suffix(".html").read_text()
    assert named in feedback.replace("&#39;", "'")


def test_bad_submissions_are_named_and_graded_without_a_hang(tmp_path):
    """A deleted solution cell, a renamed function, code that raises on import, a function that never returns,
    a missing notebook and a file that is not a notebook: each is named before grading, none stops the others,
    and the hang is cut by the cell timeout."""
    name = "10_context_parallel"
    course = _copy_course(tmp_path, name)
    with open(course / "nbgrader_config.py", "a") as f:
        f.write("\nc.Execute.timeout = 60\n")  # a first cell importing torch on a busy machine takes 20 s
    course_script.release(course)
    (released_path,) = (course / "release" / name).glob("*.ipynb")
    released = json.loads(released_path.read_text())
    right = json.loads(next((course / "source" / name).glob("*.ipynb")).read_text())
    deleted = json.loads(json.dumps(released))
    deleted["cells"] = [c for c in deleted["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id")
                        not in ("merge_partials", "check_merge_partial_attention_sum")]
    renamed = json.loads(json.dumps(right))
    for cell in renamed["cells"]:
        cell["source"] = "".join(cell["source"]).replace("def merge_partials(", "def my_merge(")
    _hand_in(course, "right", name, right)
    _hand_in(course, "deleted", name, deleted)
    _hand_in(course, "renamed", name, renamed)
    _hand_in(course, "raises", name, _with_bodies(released, "merge_partials", ("import not_a_module",)))
    _hand_in(course, "hangs", name, _with_bodies(released, "merge_partials", ("while True:\n    pass",)))
    (course / "submitted" / "missing" / name).mkdir(parents=True)
    (course / "submitted" / "corrupt" / name).mkdir(parents=True)
    (course / "submitted" / "corrupt" / name / released_path.name).write_text("not a notebook")

    done = subprocess.run([sys.executable, str(SCRIPT), "grade", "--course", str(course)], capture_output=True,
                          text=True, timeout=900, start_new_session=True)
    assert done.returncode == 0, done.stdout + done.stderr
    for student, named in [("deleted", "the cell where merge_partials is written is gone"),
                           ("renamed", "no longer defines merge_partials"),
                           ("missing", "is missing: it scores 0"),
                           ("corrupt", "is not a notebook nbgrader can read")]:
        assert f"{student}, {name}: " in done.stderr and named in done.stderr, (student, done.stderr)
    rows = {r["student_id"]: float(r["score"]) for r in csv.DictReader((course / "grades.csv").open())}
    assert rows == {"right": 4.0, "deleted": 0.0, "renamed": 0.0, "raises": 0.0, "hangs": 0.0, "missing": 0.0,
                    "corrupt": 0.0}
    graded = json.loads((course / "autograded" / "deleted" / name / released_path.name).read_text())
    restored = [c for c in graded["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id")
                == "check_merge_partial_attention_sum"]
    assert restored, "the deleted test cell was not put back"
    feedback = (course / "feedback" / "raises" / name / released_path.name).with_suffix(".html").read_text()
    assert "ModuleNotFoundError" in feedback


INTRUSION = """
import pathlib
for what, target in [("gradebook", {gradebook!r}), ("notebook", {notebook!r}), ("library", {library!r})]:
    try:
        pathlib.Path(target).write_text("overwritten")
        print("WROTE", what)
    except OSError as exc:
        print("REFUSED", what, type(exc).__name__)
try:
    print("READ", len(pathlib.Path({notebook!r}).read_text()))
except OSError as exc:
    print("HIDDEN", type(exc).__name__)
"""


def test_a_submission_cannot_write_the_gradebook_the_library_or_another_students_notebook(tmp_path):
    """An intruder's cell tries to overwrite the gradebook, the notebook of a student graded after it and a file of
    the library, and to read that notebook: each attempt fails, and the other student keeps full marks."""
    problem = course_script.sandbox_problem(ROOT / "course")
    if problem:
        pytest.skip(problem)
    name = "10_context_parallel"
    course = _copy_course(tmp_path, name)
    course_script.release(course)
    (released_path,) = (course / "release" / name).glob("*.ipynb")
    right = next((course / "source" / name).glob("*.ipynb")).read_text()
    _hand_in(course, "right", name, json.loads(right))
    (course / "gradebook.db").write_bytes(b"")  # made now, so that the intruder meets it
    victim = course / "submitted" / "right" / name / released_path.name
    library = ROOT / "shardlib" / "exercises" / "intruder.txt"
    intruder = json.loads(released_path.read_text())
    cell = next(c for c in intruder["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "merge_partials")
    cell["source"] = INTRUSION.format(gradebook=str(course / "gradebook.db"), notebook=str(victim),
                                      library=str(library)) + "".join(cell["source"])
    _hand_in(course, "intruder", name, intruder)
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), "grade", "--course", str(course)], capture_output=True,
                              text=True, timeout=900, start_new_session=True)
        assert not library.exists(), "the intruder wrote into the library"
    finally:
        library.unlink(missing_ok=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "unsandboxed" not in done.stderr
    assert victim.read_text() == json.dumps(json.loads(right))
    rows = {r["student_id"]: float(r["score"]) for r in csv.DictReader((course / "grades.csv").open())}
    assert rows == {"right": 4.0, "intruder": 0.0}
    graded = json.loads((course / "autograded" / "intruder" / name / released_path.name).read_text())
    cell = next(c for c in graded["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "merge_partials")
    printed = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    assert "WROTE" not in printed and "READ" not in printed, printed
    for what in ("REFUSED gradebook", "REFUSED notebook", "REFUSED library", "HIDDEN"):
        assert what in printed, printed


def test_grade_one_grades_the_exercise_notebook_a_student_filled_in(tmp_path):
    """GitHub Classroom's path: the plain exercise notebook (no nbgrader metadata), filled in or untouched,
    graded in a course of its own."""
    name = "10_context_parallel"
    starter_path = ROOT / "notebooks" / "exercises" / f"{name}_exercises.ipynb"
    starter = json.loads(starter_path.read_text())
    source = json.loads((ROOT / "course" / "source" / name / starter_path.name).read_text())
    answer = next("".join(c["source"]) for c in source["cells"]
                  if c["metadata"].get("nbgrader", {}).get("grade_id") == "merge_partials")
    filled = json.loads(json.dumps(starter))
    for cell in filled["cells"]:
        if "def merge_partials(" in "".join(cell["source"]):
            cell["source"] = answer
    scores = {}
    for student, notebook in (("filled", filled), ("untouched", starter)):
        path = tmp_path / student / starter_path.name
        path.parent.mkdir()
        path.write_text(json.dumps(notebook))
        done = subprocess.run([sys.executable, str(SCRIPT), "grade-one", str(path), "--student", student, "--out",
                               str(tmp_path / f"graded-{student}")], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{student}, {name}: " in done.stdout
        (row,) = csv.DictReader((tmp_path / f"graded-{student}" / "grades.csv").open())
        scores[student] = float(row["score"])
        assert (tmp_path / f"graded-{student}" / starter_path.with_suffix(".html").name).is_file()
    assert scores == {"filled": 4.0, "untouched": 0.0}


def test_the_classroom_workflow_grades_every_exercise_notebook_with_grade_one():
    import yaml

    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "classroom.yml").read_text())
    script = "\n".join(step.get("run", "") for step in workflow["jobs"]["grade"]["steps"])
    assert "notebooks/exercises/*_exercises.ipynb" in script and "scripts/course.py grade-one" in script
    assert "make install" in script
