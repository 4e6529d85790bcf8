"""nbgrader's settings for JupyterLab's Assignments tab (`make lab`, Binder), which looks for them first in the
folder JupyterLab serves, then in the folder assignments are fetched into: both read assignments/nbgrader_config.py
(course/nbgrader_config.py is the instructor's side)."""

load_subconfig("assignments/nbgrader_config.py")  # noqa: F821  (nbgrader's config loader defines it)
