"""nbgrader's settings for a student's side (JupyterLab's Assignments tab, `make lab`, Binder): Fetch puts each
assignment in this folder, from the course's exchange, where `make assignments` released it. The tab reads
this file from here (and the repository's nbgrader_config.py loads it); course/nbgrader_config.py is the
instructor's side."""

from pathlib import Path

c = get_config()  # noqa: F821  (nbgrader's config loader defines it)

HERE = Path(__file__).resolve().parent
c.CourseDirectory.course_id = "sharding"
c.Exchange.root = str(HERE.parent / "course" / "exchange")
c.Exchange.assignment_dir = str(HERE)
