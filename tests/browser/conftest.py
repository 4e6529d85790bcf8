import os
import shutil

import pytest

REQUIRED = os.environ.get("SHARDLIB_REQUIRE_BROWSER") == "1"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


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
