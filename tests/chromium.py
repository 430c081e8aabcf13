"""The Debian Chromium the browser tests drive (``scripts/test.sh`` installs it where apt-get runs as root)."""

from __future__ import annotations

import os
import shutil

import pytest


def chromium_path() -> str:
    """The browser's path; a skip on a developer's machine without one, a failure under CI (``CI=true``).

    Raises:
        pytest.fail.Exception: No Chromium on PATH while ``CI`` is set: the run would prove nothing.
    """
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    message = "no chromium on PATH: `apt-get install -y chromium` (scripts/test.sh installs it for CI)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(message)
    pytest.skip(message)
