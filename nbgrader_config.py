"""nbgrader's settings for JupyterLab's Assignments tab (`make lab`, Binder): the course's exchange, where
`make assignments` releases every assignment (course/nbgrader_config.py is the instructor's side)."""

from pathlib import Path

c = get_config()  # noqa: F821  (nbgrader's config loader defines it)

HERE = Path(__file__).resolve().parent
c.CourseDirectory.course_id = "sharding"
c.Exchange.root = str(HERE / "course" / "exchange")
c.Exchange.assignment_dir = str(HERE / "assignments")  # Fetch puts assignments/<assignment>/ here
