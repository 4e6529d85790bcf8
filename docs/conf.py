"""The course's website: Sphinx with MyST-NB and the book theme (``make site``; ``scripts/build_site.py``).

The builder stages the notebooks, already executed on real ranks, beside this file and writes ``index.md``
from their headers (the parts), so nothing here lists the notebooks. MyST-NB renders them as they are
(``nb_execution_mode = "off"``). Headings get JupyterLab's anchors (the heading's text, spaces as hyphens), so
a link written for JupyterLab, ``01_tensor_parallel.ipynb#Read-the-code``, leads to the same heading here.
"""

import os
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))  # build_site.jupyterlab_anchor

project = "The sharding notebooks"
author = "The shardlib authors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints"]
nb_execution_mode = "off"  # every page was executed before the build (scripts/build_site.py)
nb_merge_streams = True
myst_heading_anchors = 4
myst_heading_slug_func = "build_site.jupyterlab_anchor"
suppress_warnings = ["mystnb.unknown_mime_type"]  # a figure's static fallback is text/html, beside it
html_theme = "sphinx_book_theme"
html_title = project
html_context = {"default_mode": "light"}  # the figures are drawn on white
html_js_files = ["plotly.min.js"]  # every figure on a page draws with it (shardlib.ui.static)
# Fork the course? Set SHARDLIB_REPOSITORY to its owner/name, and each page's Binder button opens it.
repository = os.environ.get("SHARDLIB_REPOSITORY", "OWNER/REPO")
html_theme_options = {
    "repository_url": f"https://github.com/{repository}",
    "repository_branch": "HEAD",
    "path_to_docs": "notebooks",
    "use_repository_button": True,
    "launch_buttons": {"binderhub_url": "https://mybinder.org", "notebook_interface": "jupyterlab"},
    "show_toc_level": 2,
}


def _plotly_beside_the_pages(app, exception) -> None:
    """plotly.js, from the installed plotly, into the site's ``_static`` (``html_js_files`` loads it)."""
    if exception is None and app.builder.format == "html":
        import plotly

        shutil.copy(Path(plotly.__file__).parent / "package_data" / "plotly.min.js", Path(app.outdir) / "_static")


def setup(app):
    app.connect("build-finished", _plotly_beside_the_pages)
