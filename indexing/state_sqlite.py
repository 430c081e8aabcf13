"""The state of record in SQLite: the embedded default, one file under the data dir (WAL mode).

SQLAlchemy's pool of ``sqlite3`` connections (WAL: readers never wait for the writer); reads
``BEGIN`` (one snapshot), writes ``BEGIN IMMEDIATE``, so writers of other processes wait on
SQLite's file lock up to the busy timeout (``timeout_s``), then get ``StateStoreUnavailable``.
Calls run in the caller's thread: a call past its deadline is interrupted
(``sqlite3.Connection.interrupt``). Cross-process write locks: one byte each of ``<file>.lock``
(:mod:`indexing.state_locks`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sqlite3
import struct
import threading
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event

from indexing import schema
from indexing.state_admin import SqlAdmin
from indexing.state_locks import WriteLocks
from indexing.state_references import SqlQueryReferences
from indexing.state_rollouts import SqlRollouts
from indexing.state_sql import SqlCollections
from quarry.errors import StateStoreUnavailable, StoreError

# Linux open-file-description locks: per open file (not per process), released when it closes
_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)


class SqliteState(SqlCollections, SqlAdmin, SqlRollouts, SqlQueryReferences, WriteLocks):
    """Thread-safe SQLite state of record (see :class:`indexing.docstore.StateStore`)."""

    dialect = "sqlite"
    _now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    now = sa.literal_column(_now_sql)
    chunk_order = sa.literal_column("chunks.rowid")

    def __init__(self, path: Path, *, timeout_s: float = 5.0, pool_size: int = 8) -> None:
        """Open (or create) the database at ``path`` and bring its schema up to date.

        Raises:
            StoreError: The file is not an SQLite database (damaged, or another file), it or its
                folder cannot be opened, or it was written by a newer Quarry; the message names
                the file.
            StateStoreUnavailable: Another process holds its write lock past the busy timeout.
        """
        self.path = path
        self.location = str(path)
        self._watch_lock = threading.Lock()
        self._watch: sqlite3.Connection | None = None  # change_token's own connection
        self._init_locks()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            engine = sa.create_engine(
                f"sqlite:///{path}", pool_size=pool_size, max_overflow=pool_size, pool_timeout=timeout_s,
                connect_args={"timeout": timeout_s, "check_same_thread": False},
            )
        except OSError as exc:
            raise self._damaged(exc) from exc
        event.listen(engine, "connect", _on_connect)
        event.listen(engine, "begin", _on_begin)
        self._setup(engine, timeout_s, pool_size, inline=True)
        try:
            with self._errors(), engine.connect() as conn:
                conn = conn.execution_options(quarry_write=True)
                with conn.begin():
                    schema.upgrade(conn, self.location)
        except StateStoreUnavailable:
            self.close()
            raise
        except StoreError as exc:
            self.close()
            if isinstance(exc.__cause__, sa.exc.DatabaseError):
                raise self._damaged(exc.__cause__) from exc
            raise
        except (sa.exc.DatabaseError, OSError) as exc:
            self.close()
            raise self._damaged(exc) from exc

    def _damaged(self, exc: BaseException) -> StoreError:
        return StoreError(
            f"cannot open the docstore {self.path}: {exc}; it holds every chunk's text: restore it from a "
            "backup, or move it away to start empty and ingest again"
        )

    def _begin_write(self, conn: sa.Connection) -> sa.Connection:
        return conn.execution_options(quarry_write=True)

    def _abort(self, dbapi_connection: Any) -> None:
        dbapi_connection.interrupt()

    def change_token(self) -> int:
        """A number that changes whenever any connection commits to the database, in this process or another.

        SQLite's ``PRAGMA data_version`` on a connection of its own, which never writes (so every
        commit, this process's own included, is another connection's), ~20 µs: callers that cache
        what they read re-read only after a commit, and still see a key revoked by
        ``quarry keys revoke`` or another worker on their next request.
        """
        with self._watch_lock:
            if self._watch is None:
                self._watch = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            return int(self._watch.execute("PRAGMA data_version").fetchone()[0])

    def close(self) -> None:
        """Close the database."""
        super().close()
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None

    # --- write locks: one byte of <file>.lock per (tenant, name) ------------------------------
    def _lock_open(self, key: str) -> Any:
        path = self.path.with_name(self.path.name + ".lock")
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o600)

    def _lock_try(self, handle: Any, key: str) -> bool:
        if _OFD_SETLK is None:  # no per-file locks here: one lock for the whole file
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True
        offset = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 2
        request = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
        try:
            fcntl.fcntl(handle, _OFD_SETLK, request)
        except (BlockingIOError, PermissionError):
            return False
        return True

    def _lock_release(self, handle: Any, key: str) -> None:
        with contextlib.suppress(OSError):
            os.close(handle)  # releases its lock (an open-file-description lock, or the flock)


def _on_connect(dbapi: sqlite3.Connection, record: Any) -> None:
    """Each pooled connection: transactions begun by us (``_on_begin``), WAL, NORMAL sync."""
    dbapi.isolation_level = None
    dbapi.execute("PRAGMA journal_mode=WAL")
    dbapi.execute("PRAGMA synchronous=NORMAL")


def _on_begin(conn: sa.Connection) -> None:
    """``BEGIN IMMEDIATE`` for a write (the file's write lock now, or the busy timeout), else ``BEGIN``."""
    write = conn.get_execution_options().get("quarry_write")
    conn.connection.driver_connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")  # type: ignore[union-attr]
