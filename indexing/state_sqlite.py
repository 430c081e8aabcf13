"""The state of record in SQLite: the embedded default, one file under the data dir (WAL mode).

One connection shared by the process's threads under a lock; every method is one transaction
(``BEGIN IMMEDIATE`` for writes, so writers of other processes wait on SQLite's file lock, up to
its 5 s busy timeout, then get ``StoreUnavailable``).
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from indexing import schema
from indexing.state_admin import SqlAdmin
from indexing.state_locks import WriteLocks
from indexing.state_sql import SqlCollections
from quarry.errors import StoreError, StoreUnavailable


class _Tx:
    """:class:`~indexing.state_sql.Tx` over an sqlite3 connection (``?`` is its own mark)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        rows = self._db.execute(sql, params).fetchall()  # whole: a RETURNING statement must finish
        return rows[0] if rows else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._db.execute(sql, params).fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        return self._db.execute(sql, params).rowcount

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._db.executemany(sql, rows)


class SqliteState(SqlCollections, SqlAdmin, WriteLocks):
    """Thread-safe SQLite state of record (see :class:`indexing.docstore.StateStore`)."""

    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    chunk_order = "rowid"

    def __init__(self, path: Path) -> None:
        """Open (or create) the database at ``path`` and bring its schema up to date.

        Raises:
            StoreError: The file is not an SQLite database (damaged, or another file), it or its
                folder cannot be opened, or it was written by a newer Quarry; the message names
                the file.
            StoreUnavailable: Another process holds its write lock past the busy timeout.
        """
        self.path = path
        self.location = str(path)
        self._lock = threading.RLock()
        self._watch_lock = threading.Lock()
        self._watch: sqlite3.Connection | None = None  # change_token's own connection
        self._init_locks()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._migrate()
            except (sqlite3.DatabaseError, StoreError):
                self._db.close()
                raise
        except (sqlite3.DatabaseError, OSError) as exc:  # e.g. "file is not a database"
            raise StoreError(
                f"cannot open the docstore {path}: {exc}; it holds every chunk's text: restore it from a "
                "backup, or move it away to start empty and ingest again"
            ) from exc

    def _migrate(self) -> None:
        """Apply the missing schema steps in one transaction."""
        with self._write() as tx:
            tx.run(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)"
            )
            applied = {int(r[0]) for r in tx.all("SELECT version FROM schema_migrations")}
            schema.check_known("sqlite", applied, self.location)
            now = time.time()
            for step in schema.steps("sqlite", now):
                if step.version in applied:
                    continue
                for statement in step.statements:
                    tx.run(statement)
                tx.run("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (step.version, now))

    def _lock_open(self, key: str) -> IO[bytes]:
        folder = self.path.with_name(self.path.name + ".locks")  # flock files, one per collection
        folder.mkdir(exist_ok=True)
        return (folder / f"{key}.lock").open("ab")

    def _lock_try(self, handle: IO[bytes], key: str) -> bool:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def _lock_release(self, handle: IO[bytes], key: str) -> None:
        with contextlib.suppress(OSError):
            fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None

    def change_token(self) -> int:
        """A number that changes whenever any connection commits to the database, in this process or another.

        SQLite's ``PRAGMA data_version`` on a connection of its own, which never writes (so every
        commit, the service's own included, is another connection's), ~20 µs: callers that cache
        what they read (the API key verifier) re-read only after a commit, and still see a key
        revoked by ``quarry keys revoke`` or another worker on their next request.
        """
        with self._watch_lock:
            if self._watch is None:
                self._watch = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            return int(self._watch.execute("PRAGMA data_version").fetchone()[0])

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield _Tx(self._db)
            finally:
                self._db.execute("COMMIT")

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:  # "database is locked" after sqlite's busy timeout
                raise StoreUnavailable(
                    f"the docstore {self.path} is busy ({exc}): another process holds its write lock; retry",
                    retry_after_s=1.0,
                ) from exc
            try:
                yield _Tx(self._db)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
