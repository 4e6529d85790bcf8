import os

import pytest

from .lab_server import chromium_path

REQUIRED = os.environ.get("SHARDLIB_REQUIRE_BROWSER") == "1"


@pytest.fixture(scope="session")
def chromium():
    """Debian's chromium on the PATH; a skip that says so when there is none (a failure in CI)."""
    path = chromium_path()
    reason = "browser test skipped: no chromium on the PATH (Debian: apt-get install chromium)"
    try:
        import playwright  # noqa: F401
    except ImportError:
        path, reason = None, "browser test skipped: the playwright package is not installed"
    if path is None:
        if REQUIRED:
            pytest.fail(reason.replace("skipped", "required (SHARDLIB_REQUIRE_BROWSER=1) but cannot run"))
        pytest.skip(reason)
    return path
