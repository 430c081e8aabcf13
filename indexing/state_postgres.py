"""The state of record in PostgreSQL (psycopg 3): shared by API replicas and workers.

``QUARRY_DOCSTORE__URL=postgresql://user:pass@host:5432/db``. Connections come from a pool
(autocommit, transactions begun explicitly): reads are ``REPEATABLE READ READ ONLY`` (one
snapshot per call), writes ``READ COMMITTED``, where the ``UPDATE collections SET seq = seq + 1``
row lock that every document write takes first serialises the writers of one collection across
processes and hosts. The schema steps are applied at open under an advisory lock, so replicas
that start together migrate once.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from indexing import schema
from indexing.state_admin import SqlAdmin
from indexing.state_locks import WriteLocks
from indexing.state_sql import SqlCollections
from quarry.errors import StoreError, StoreUnavailable
from stores.base import redact_url

_MIGRATION_LOCK = 0x5175617272790001  # pg_advisory_xact_lock key: "Quarry" + 1
_LOCK_PREFIX = "quarry write lock "  # + tenant.collection, hashed to a session advisory lock key


class _Tx:
    """:class:`~indexing.state_sql.Tx` over a psycopg cursor (``?`` marks become ``%s``)."""

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self._cur = cur

    def one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        self._cur.execute(sql.replace("?", "%s"), params)
        return self._cur.fetchone() if self._cur.description else None

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        self._cur.execute(sql.replace("?", "%s"), params)
        return self._cur.fetchall()

    def run(self, sql: str, params: Sequence[Any] = ()) -> int:
        self._cur.execute(sql.replace("?", "%s"), params)
        return self._cur.rowcount

    def many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._cur.executemany(sql.replace("?", "%s"), rows)


class PostgresState(SqlCollections, SqlAdmin, WriteLocks):
    """Thread-safe PostgreSQL state of record (see :class:`indexing.docstore.StateStore`)."""

    now_sql = "extract(epoch from clock_timestamp())::float8"
    chunk_order = "ord"

    def __init__(self, url: str, *, pool_size: int = 8, connect_timeout_s: float = 10.0) -> None:
        """Connect and bring the schema up to date.

        Raises:
            StoreUnavailable: The server cannot be reached within ``connect_timeout_s``.
            StoreError: The schema cannot be migrated (e.g. written by a newer Quarry).
        """
        self.location = redact_url(url)
        self._init_locks()
        self._pool = ConnectionPool(
            url, min_size=1, max_size=pool_size, timeout=connect_timeout_s, open=False,
            kwargs={"autocommit": True, "connect_timeout": max(1, int(connect_timeout_s))},
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(
                f"cannot reach the docstore {self.location} within {connect_timeout_s:g} s", retry_after_s=5.0
            ) from exc
        try:
            self._migrate()
        except BaseException:
            self._pool.close()
            raise

    def _migrate(self) -> None:
        with self._write() as tx:
            tx.one("SELECT pg_advisory_xact_lock(?)", (_MIGRATION_LOCK,))
            tx.run(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
            )
            applied = {int(r[0]) for r in tx.all("SELECT version FROM schema_migrations")}
            schema.check_known("postgres", applied, self.location)
            now = time.time()
            for step in schema.steps("postgres", now):
                if step.version in applied:
                    continue
                for statement in step.statements:
                    tx.run(statement)
                tx.run("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (step.version, now))

    def _lock_open(self, key: str) -> psycopg.Connection[Any]:
        try:  # a session of its own: the advisory lock lives as long as it
            return self._pool.getconn()
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no connection to the docstore {self.location}: {exc}", retry_after_s=1.0) from exc

    def _lock_try(self, handle: psycopg.Connection[Any], key: str) -> bool:
        try:
            row = handle.execute(
                "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (_LOCK_PREFIX + key,)
            ).fetchone()
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the docstore {self.location} failed: {exc}", retry_after_s=1.0) from exc
        return bool(row and row[0])

    def _lock_release(self, handle: psycopg.Connection[Any], key: str) -> None:
        with contextlib.suppress(psycopg.Error):
            handle.execute("SELECT pg_advisory_unlock_all()")
        self._pool.putconn(handle)

    def close(self) -> None:
        """Close the pool."""
        self._pool.close()

    @contextmanager
    def _read(self) -> Iterator[_Tx]:
        with self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") as tx:
            yield tx

    @contextmanager
    def _write(self) -> Iterator[_Tx]:
        with self._transaction("BEGIN") as tx:
            yield tx

    @contextmanager
    def _transaction(self, begin: str) -> Iterator[_Tx]:
        try:
            with self._pool.connection() as conn, conn.cursor() as cur:
                cur.execute(begin)
                try:
                    yield _Tx(cur)
                except BaseException:
                    with contextlib.suppress(psycopg.Error):
                        cur.execute("ROLLBACK")
                    raise
                cur.execute("COMMIT")
        except PoolTimeout as exc:
            raise StoreUnavailable(f"no connection to the docstore {self.location}: {exc}", retry_after_s=1.0) from exc
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"the docstore {self.location} failed: {exc}", retry_after_s=1.0) from exc
        except psycopg.Error as exc:
            raise StoreError(f"the docstore {self.location} failed: {exc}") from exc
