"""The serve harness (tests/serve.py): a server that cannot start is an error that shows why, not a wait."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.serve import QuarryServer, ServerNotReady

REPO = Path(__file__).resolve().parents[1]


def test_a_server_that_exits_at_start_raises_with_its_error_line(tmp_path: Path) -> None:
    env = {**os.environ, "QUARRY_DATA_DIR": str(tmp_path), "PYTHONPATH": str(REPO),
           "QUARRY_SEARCH__CANDIDATES": "many"}
    server = QuarryServer(env, cwd=REPO)
    with pytest.raises(ServerNotReady, match=r"exited \(2\)[\s\S]*QUARRY_SEARCH__CANDIDATES"):
        server.wait_ready(timeout_s=120)
    assert not server.log.exists()  # its own temporary log is removed once it is stopped
