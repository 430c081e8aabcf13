"""Every state call has a deadline (``QUARRY_DOCSTORE__TIMEOUT_S``): late is ``StateStoreUnavailable``, never a hang.

SQLite: a write behind another process's write lock gives up at the deadline (the busy timeout),
and a runaway statement is interrupted there. :class:`~indexing.state_calls.Deadlines` itself: a
call on its threads that never returns fails its caller at the deadline and the connection it
holds is aborted; code inside ``cache_only`` never waits. (PostgreSQL behind a paused proxy:
``test_state_stall.py``.)
"""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from indexing.docstore import CacheMiss, cache_only, open_docstore
from indexing.state_calls import Deadlines
from quarry.errors import StateStoreUnavailable

TIMEOUT_S = 0.5


def test_a_write_behind_another_process_lock_gives_up_at_the_deadline(tmp_path: Path) -> None:
    state = open_docstore("", tmp_path, timeout_s=TIMEOUT_S)
    other = sqlite3.connect(tmp_path / "docstore.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process's writer, holding the file's write lock
        started = time.monotonic()
        with pytest.raises(StateStoreUnavailable) as caught:
            state.put_collection("c", {})
        assert time.monotonic() - started < TIMEOUT_S + 1
        assert caught.value.retryable and caught.value.retry_after_s
        other.execute("ROLLBACK")
        state.put_collection("c", {})  # and it works again at once
        assert state.list_collections() == ["c"]
    finally:
        other.close()
        state.close()


def test_a_runaway_sqlite_statement_is_interrupted_at_the_deadline(tmp_path: Path) -> None:
    state = open_docstore("", tmp_path, timeout_s=TIMEOUT_S)

    def forever() -> int:
        with state._read() as conn:  # type: ignore[attr-defined]
            return int(conn.exec_driver_sql(
                "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
            ).scalar_one())

    try:
        started = time.monotonic()
        with pytest.raises(StateStoreUnavailable, match="did not answer within 0.5 s"):
            state._calls.call(forever)  # type: ignore[attr-defined]
        assert time.monotonic() - started < TIMEOUT_S + 1
        state.put_collection("c", {})  # the interrupted connection serves again
    finally:
        state.close()


def test_a_call_that_never_returns_fails_its_caller_and_its_connection_is_aborted() -> None:
    aborted: list[object] = []
    calls = Deadlines(TIMEOUT_S, 2, "test", aborted.append)
    release = threading.Event()

    def stuck() -> str:
        calls.attach("connection 1")  # as the pool's checkout does
        release.wait(30)
        return "late"

    try:
        started = time.monotonic()
        with pytest.raises(StateStoreUnavailable):
            calls.call(stuck)
        assert time.monotonic() - started < TIMEOUT_S + 1
        assert aborted == ["connection 1"]
        future = calls.submit(lambda: "fine")
        assert future.result(5) == "fine"  # the other thread still serves
        with cache_only(), pytest.raises(CacheMiss):
            calls.call(lambda: "never run")
    finally:
        release.set()
        calls.close()
