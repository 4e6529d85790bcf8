"""nbgrader's settings for the course: this folder is the course directory (source/, release/, submitted/,
autograded/, feedback/ and the gradebook). Run nbgrader from here, or through `make assignments` and
`make grade` from the repository's root."""

from pathlib import Path

c = get_config()  # noqa: F821  (nbgrader's config loader defines it)

HERE = Path(__file__).resolve().parent
c.CourseDirectory.course_id = "sharding"
c.CourseDirectory.root = str(HERE)
c.CourseDirectory.db_url = f"sqlite:///{HERE / 'gradebook.db'}"
# A released function keeps its signature and docstring; its body is the starter's one line.
c.ClearSolutions.code_stub = {"python": 'raise NotImplementedError("write your code here")'}
# A grader on live ranks takes seconds; one that hangs is stopped here and the submission keeps what it passed.
c.Execute.timeout = 180
c.Execute.interrupt_on_timeout = True
# The exchange that `make assignments` releases into and JupyterLab's Assignments tab lists (the
# repository's nbgrader_config.py points the tab here): fetch, submit and collect all work on one machine.
c.Exchange.root = str(HERE / "exchange")
# A test cell a student deleted is put back before grading, so that deleting a failing check never pays.
c.OverwriteCells.add_missing_cells = True
