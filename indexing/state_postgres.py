"""The state of record in PostgreSQL (SQLAlchemy over psycopg 3): shared by API replicas and workers.

``QUARRY_DOCSTORE__URL=postgresql://user:pass@host:5432/db[?schema=name]`` (``schema``: the tables'
schema, created if missing; else the server's ``search_path``, which ``options=-csearch_path=…``
may set). Reads are ``REPEATABLE READ READ ONLY`` (one snapshot per call), writes ``READ
COMMITTED``, where the ``UPDATE collections SET seq = seq + 1`` row lock that every document
write takes first serialises the writers of one collection across processes and hosts. The
migrations run at open under an advisory lock, so replicas that start together migrate once.

Calls run on the state's threads under a deadline (:mod:`indexing.state_calls`); a late call's
socket is shut down, so its thread comes back and the pool discards the connection. Every write
that a cached read depends on sends ``NOTIFY quarry_state`` in its transaction; a listener
thread per process advances the change token on each, and checks its own connection every few
seconds: while it cannot, the token is ``None`` and every read goes to the server.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import socket
import threading
import time
import uuid
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import sqlalchemy as sa

from indexing import schema
from indexing.state_admin import SqlAdmin
from indexing.state_locks import WriteLocks
from indexing.state_references import SqlQueryReferences
from indexing.state_rollouts import SqlRollouts
from indexing.state_sql import SqlCollections
from quarry.errors import ConfigError, StateStoreUnavailable
from stores.base import redact_url

log = logging.getLogger(__name__)
_MIGRATION_LOCK = 0x5175617272790001  # pg_advisory_xact_lock key: "Quarry" + 1
_LOCK_PREFIX = "quarry write lock "  # + tenant.collection, hashed to a session advisory lock key
CHANNEL = "quarry_state"
LISTEN_CHECK_S = 2.0  # the listener's own connection is checked this often
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def split_url(url: str) -> tuple[str, str | None]:
    """``(libpq URL, schema)``: the ``?schema=`` parameter taken out of ``url``.

    Raises:
        ConfigError: The schema is not a plain identifier.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    name = next((v for k, v in query if k == "schema"), None)
    if name is not None and not _SCHEMA_NAME.fullmatch(name):
        raise ConfigError(f"docstore schema {name!r}: a letter or '_' first, then letters, digits, '_' (at most 63)")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(scheme="postgresql", query=rest)), name


class PostgresState(SqlCollections, SqlAdmin, SqlRollouts, SqlQueryReferences, WriteLocks):
    """Thread-safe PostgreSQL state of record (see :class:`indexing.docstore.StateStore`)."""

    dialect = "postgresql"
    _now_sql = "extract(epoch from clock_timestamp())::float8"
    now = sa.literal_column(_now_sql)
    chunk_order = sa.literal_column("chunks.ord")

    def __init__(
        self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0, timeout_s: float = 5.0
    ) -> None:
        """Connect, bring the schema up to date and start the change listener.

        Raises:
            StateStoreUnavailable: The server cannot be reached within ``connect_timeout_s``.
            StoreError: The schema cannot be migrated (e.g. written by a newer Quarry).
            ConfigError: A malformed ``?schema=``.
        """
        self.location = redact_url(url)
        conninfo, self.schema_name = split_url(url)
        self._conninfo = conninfo
        self._connect_kwargs: dict[str, Any] = {"connect_timeout": max(2, math.ceil(timeout_s))}
        if self.schema_name:
            self._connect_kwargs["options"] = f"-csearch_path={self.schema_name}"
        self._init_locks()
        engine = sa.create_engine(
            "postgresql+psycopg://", creator=self._connect, pool_size=pool_size, max_overflow=pool_size,
            pool_timeout=timeout_s, pool_reset_on_return="rollback",
        )
        self._setup(engine, timeout_s, pool_size, inline=False)
        self._listened = 0  # notifications of other processes seen
        self._me = uuid.uuid4().hex
        self._listening = False
        self._stop = threading.Event()
        self._listener: threading.Thread | None = None
        try:
            self._open(connect_timeout_s)
        except BaseException:
            self.close()
            raise

    def _connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self._conninfo, **self._connect_kwargs)

    def _open(self, connect_timeout_s: float) -> None:
        try:
            first = psycopg.connect(self._conninfo, connect_timeout=max(2, math.ceil(connect_timeout_s)))
        except psycopg.OperationalError as exc:
            raise StateStoreUnavailable(
                f"cannot reach the docstore {self.location} within {connect_timeout_s:g} s", detail=str(exc),
                retry_after_s=5.0,
            ) from exc
        first.close()
        with self._errors(), self._engine.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            if self.schema_name:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema_name}"')
            schema.upgrade(conn, self.location)
        self._listener = threading.Thread(target=self._listen, name="quarry-state-listen", daemon=True)
        self._listener.start()

    def _begin_read(self, conn: sa.Connection) -> sa.Connection:
        return conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)

    def _autocommit(self, conn: Any, on: bool) -> None:
        conn.driver_connection.autocommit = on  # idle: psycopg sets it without a round trip

    def _notify(self, conn: sa.Connection) -> None:
        # the payload names this process's store: its own listener skips it (_changed() counted it at once)
        conn.execute(sa.text("SELECT pg_notify(:channel, :me)"), {"channel": CHANNEL, "me": self._me})

    def _abort(self, dbapi_connection: Any) -> None:
        """Shut the late call's socket down: its thread's wait returns, the pool discards the connection."""
        driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
        with contextlib.suppress(OSError, psycopg.Error, ValueError):
            fd = driver.pgconn.socket
            with socket.socket(fileno=socket.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    # --- the change token ------------------------------------------------------------------
    def change_token(self) -> int | None:
        """The notifications seen plus this process's own commits; ``None`` while the listener is down."""
        if not self._listening:
            return None
        return self._listened + self._local_changes

    def _listen(self) -> None:
        """Keep a ``LISTEN`` connection; count notifications; check the connection every few seconds."""
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, **self._connect_kwargs) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self._listened += 1  # whatever was missed while not listening
                    self._listening = True
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=LISTEN_CHECK_S):
                            if note.payload != self._me:
                                self._listened += 1
                        with self._calls.guard(conn):
                            conn.execute("SELECT 1")
            except (psycopg.Error, StateStoreUnavailable, OSError) as exc:
                if self._listening:
                    log.warning("state store %s: change listener lost (%s); reading every time", self.location, exc)
                self._listening = False
                self._stop.wait(1.0)
        self._listening = False

    def close(self) -> None:
        """Stop the listener and close the pool."""
        if hasattr(self, "_stop"):
            self._stop.set()
        super().close()

    # --- write locks: session advisory locks ---------------------------------------------------
    def _lock_open(self, key: str) -> Any:
        try:  # a session of its own: the advisory lock lives as long as it
            return self._calls.call(self._engine.raw_connection)
        except sa.exc.TimeoutError as exc:
            raise self._unavailable(exc) from exc
        except sa.exc.DBAPIError as exc:
            raise self._unavailable(exc) from exc

    def _lock_try(self, handle: Any, key: str) -> bool:
        try:
            with self._calls.guard(handle.driver_connection):
                cur = handle.cursor()
                cur.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (_LOCK_PREFIX + key,))
                row = cur.fetchone()
                handle.commit()
        except StateStoreUnavailable:
            handle.invalidate()
            raise
        except psycopg.Error as exc:
            handle.invalidate()
            raise self._unavailable(exc) from exc
        return bool(row and row[0])

    def _lock_release(self, handle: Any, key: str) -> None:
        with contextlib.suppress(psycopg.Error, StateStoreUnavailable), self._calls.guard(handle.driver_connection):
            cur = handle.cursor()
            cur.execute("SELECT pg_advisory_unlock_all()")
            handle.commit()
        handle.close()  # back to the pool (or discarded, when it failed)


def wait_listening(state: PostgresState, timeout_s: float = 10.0) -> bool:
    """Whether the change listener of ``state`` is up within ``timeout_s`` (tests and the readiness probe)."""
    deadline = time.monotonic() + timeout_s
    while not state._listening and time.monotonic() < deadline:
        time.sleep(0.02)
    return state._listening
