"""What both state-of-record backends share below the queries: the engine, transactions, deadlines, caches.

A backend (:mod:`indexing.state_sqlite`, :mod:`indexing.state_postgres`) builds a SQLAlchemy
engine for its dialect and says how its clock reads, how its chunks are ordered and how a late
connection is aborted; :class:`SqlBase` gives every query module (:mod:`indexing.state_sql`,
:mod:`indexing.state_admin`) a read transaction (one snapshot) and a write transaction, and
runs every public call under a deadline (:mod:`indexing.state_calls`, decorator :func:`timed`).

Hot reads that requests make on every call (a collection's configuration, state and seq) are
kept per ``(tenant, name)`` with the change token read before them (:func:`cached`): while the
token is unchanged nothing was committed, and the entry answers without a query. The token is
``PRAGMA data_version`` on SQLite (any commit of any process) and, on PostgreSQL, a counter a
``LISTEN`` thread advances on every notification a write sends; ``None`` (no listener) reads
every time.
"""

from __future__ import annotations

import copy
import functools
import operator
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Concatenate, ParamSpec, Self, TypeVar, cast

import orjson
import sqlalchemy as sa
from sqlalchemy import event

from indexing.docstore import DEFAULT_TENANT
from indexing.state_calls import CacheMiss, Deadlines, caching_only
from quarry.errors import StateStoreUnavailable, StoreError

P = ParamSpec("P")
T = TypeVar("T")
S = TypeVar("S", bound="SqlBase")
CACHE_ENTRIES = 10_000  # past it the cache starts over (names asked that do not exist count too)


def timed(fn: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """Run a public state call under the backend's deadline (see :class:`~indexing.state_calls.Deadlines`)."""

    @functools.wraps(fn)
    def run(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._calls.call(fn, self, *args, **kwargs)

    return cast(Callable[Concatenate[S, P], T], run)


BULK_TIMEOUT_S = 600.0  # a read or delete of a whole collection's rows (millions of chunks): a stall still ends


def timed_bulk(fn: Callable[Concatenate[S, P], T]) -> Callable[Concatenate[S, P], T]:
    """:func:`timed` with the deadline of :data:`BULK_TIMEOUT_S` (or the setting's, if longer)."""

    @functools.wraps(fn)
    def run(self: S, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._calls.call_within(max(BULK_TIMEOUT_S, self.timeout_s), fn, self, *args, **kwargs)

    return cast(Callable[Concatenate[S, P], T], run)


def cached(kind: str) -> Callable[[Callable[[S, str], T]], Callable[[S, str], T]]:
    """Answer ``fn(self, name)`` from the cache while the change token is unchanged (see the module doc)."""

    def wrap(fn: Callable[[S, str], T]) -> Callable[[S, str], T]:
        @functools.wraps(fn)
        def run(self: S, name: str) -> T:
            token = self.change_token()
            key = (self.tenant, kind, name)
            if token is not None:
                hit = self._cache.get(key)
                if hit is not None and hit[0] == token:
                    return hit[1]  # type: ignore[no-any-return]
            value = self._calls.call(fn, self, name)
            if token is not None:
                if len(self._cache) >= CACHE_ENTRIES:
                    self._cache.clear()
                self._cache[key] = (token, value)
            return value

        return run

    return wrap


class SqlBase:
    """The engine, transactions and deadlines of one state of record (subclasses open the engine)."""

    location: str
    tenant: str = DEFAULT_TENANT
    dialect: str  # SQLAlchemy's name: "sqlite" or "postgresql"
    _now_sql: str  # the database's clock as Unix seconds, in SQL
    now: sa.ColumnElement[float]  # ... as an expression
    chunk_order: sa.ColumnElement[int]  # orders chunks by insertion
    _engine: sa.Engine
    _calls: Deadlines
    _cache: dict[tuple[str, str, str], tuple[int, Any]]

    def _setup(self, engine: sa.Engine, timeout_s: float, workers: int, *, inline: bool) -> None:
        """Keep ``engine``, start the deadlines, and record each checked-out connection on its call."""
        self._engine = engine
        self.timeout_s = timeout_s
        self._calls = Deadlines(timeout_s, workers, self.location, self._abort, inline=inline)
        self._cache = {}
        self._bump_lock = threading.Lock()
        self._local_changes = 0
        event.listen(engine, "checkout", lambda dbapi, record, proxy: self._calls.attach(dbapi))
        event.listen(engine, "checkin", lambda dbapi, record: self._calls.detach())

    def _abort(self, dbapi_connection: Any) -> None:
        """Abort a connection a late call holds (from the watchdog's thread; must not block)."""
        raise NotImplementedError

    def _unavailable(self, exc: BaseException) -> StateStoreUnavailable:
        return StateStoreUnavailable(
            f"the state store {self.location} is unavailable", detail=str(exc), retry_after_s=max(1.0, self.timeout_s)
        )

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Driver errors as Quarry's: unreachable, busy or late -> ``StateStoreUnavailable``, else ``StoreError``."""
        try:
            yield
        except sa.exc.TimeoutError as exc:  # no pooled connection in time
            raise self._unavailable(exc) from exc
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError):
                raise self._unavailable(exc) from exc
            raise StoreError(f"the state store {self.location} failed", detail=str(exc.orig)) from exc

    @contextmanager
    def _read(self) -> Iterator[sa.Connection]:
        """A read-only transaction that sees one snapshot."""
        with self._errors(), self._engine.connect() as conn:
            conn = self._begin_read(conn)
            with conn.begin():
                yield conn

    @contextmanager
    def _write(self, *, notify: bool = True) -> Iterator[sa.Connection]:
        """A write transaction: commits on success, rolls back on any error.

        ``notify``: the commit moves the change token (every replica's cached reads are read
        again); leases, jobs and the audit log do not.

        Raises:
            StateStoreUnavailable: Another writer holds the lock past the deadline, or the server
                is unreachable.
        """
        with self._errors(), self._engine.connect() as conn:
            conn = self._begin_write(conn)
            with conn.begin():
                yield conn
                if notify:
                    self._notify(conn)
        if notify:
            self._changed()

    def _fetch(self, statement: sa.Executable, params: dict[str, Any]) -> list[Any]:
        """The rows of one read-only statement (one snapshot: a statement's own), on a pooled DBAPI connection.

        The search page's read (~10 rows): SQLAlchemy's ``Connection`` and ``Result`` layers cost
        more than SQLite took to answer. The SQL is still SQLAlchemy's, rendered for the dialect.
        """
        sql, order, fixed = rendered(statement, self._engine.dialect)
        values = {**fixed, **params}
        args: Any = values if order is None else tuple(values[k] for k in order)
        driver = self._engine.dialect.loaded_dbapi
        with self._errors():
            conn = self._engine.raw_connection()
            try:
                self._autocommit(conn, True)  # one statement, its own snapshot: no BEGIN/COMMIT round trips
                try:
                    cursor = conn.cursor()
                    cursor.execute(sql, args)
                    rows = list(cursor.fetchall())
                    cursor.close()
                finally:
                    self._autocommit(conn, False)
            except driver.OperationalError as exc:
                conn.invalidate()
                raise self._unavailable(exc) from exc
            except driver.Error as exc:
                raise StoreError(f"the state store {self.location} failed", detail=str(exc)) from exc
            finally:
                conn.close()
        return rows

    def _autocommit(self, conn: Any, on: bool) -> None:
        """Set a pooled DBAPI connection's autocommit (PostgreSQL; SQLite's connections always are)."""

    def _begin_read(self, conn: sa.Connection) -> sa.Connection:
        return conn

    def _begin_write(self, conn: sa.Connection) -> sa.Connection:
        return conn

    def _notify(self, conn: sa.Connection) -> None:
        """Tell the other processes, in the write's transaction, that the state changed (PostgreSQL)."""

    def _changed(self) -> None:
        """This process committed a change: its own cached reads are stale at once."""
        with self._bump_lock:
            self._local_changes += 1

    def change_token(self) -> int | None:
        """A number that changes whenever the state of record commits a change; ``None``: unknown (read every time)."""
        raise NotImplementedError

    def healthy(self) -> None:
        """One round trip within the deadline (the readiness probe).

        Raises:
            StateStoreUnavailable: No answer in time, or the server is unreachable.
        """
        self._calls.call(self._ping)

    def _ping(self) -> None:
        with self._read() as conn:
            conn.exec_driver_sql("SELECT 1")

    def submit(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> Any:
        """``fn(...)`` (a method of this store) on the state's threads: a future, failed at the deadline."""
        if caching_only():
            raise CacheMiss(getattr(fn, "__name__", "submit"))
        return self._calls.submit(fn, *args, **kwargs)

    def for_tenant(self, tenant_id: str) -> Self:
        """A view of the same database whose collections, jobs and locks are ``tenant_id``'s.

        It shares this store's connections and caches: close the store, not the view.
        """
        view = copy.copy(self)
        view.tenant = tenant_id
        return view

    def close(self) -> None:
        """Stop the deadlines and close the connections."""
        self._calls.close()
        self._engine.dispose()


RENDERED: dict[tuple[int, str], tuple[str, tuple[str, ...] | None, dict[str, Any]]] = {}


def rendered(statement: sa.Executable, dialect: sa.Dialect) -> tuple[str, tuple[str, ...] | None, dict[str, Any]]:
    """``statement``'s SQL for ``dialect``, its parameters' order (positional styles) and its literal values."""
    key = (id(statement), dialect.name)
    found = RENDERED.get(key)
    if found is None:
        compiled = statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        order = tuple(compiled.positiontup) if compiled.positional else None
        fixed = {name: b.value for name, b in compiled.binds.items() if not b.required}
        found = RENDERED[key] = (compiled.string, order, fixed)
    return found


def first(conn: sa.Connection, statement: sa.Executable, params: dict[str, Any]) -> Any:
    """The first row of ``statement`` (all of them read: a ``RETURNING`` statement must finish), or ``None``.

    Rendered once per dialect and run with ``exec_driver_sql``, as :func:`many`: the write path's
    per-statement cost.
    """
    sql, order, fixed = rendered(statement, conn.dialect)
    values = {**fixed, **params}
    rows = conn.exec_driver_sql(sql, values if order is None else tuple(values[k] for k in order)).all()
    return rows[0] if rows else None


def many(conn: sa.Connection, statement: sa.Executable, rows: list[dict[str, Any]]) -> None:
    """Execute ``statement`` once per row (the driver's ``executemany``), nothing for no rows.

    The statement is rendered once per dialect by SQLAlchemy's compiler and run with
    ``exec_driver_sql``: SQLAlchemy's per-row parameter processing cost ~7 µs a row, twice what
    the database took for a batch of 64 documents on SQLite. The values are plain ``str``,
    ``int``, ``float`` or ``None``: no type needs a bind processor.
    """
    if not rows:
        return
    sql, order, fixed = rendered(statement, conn.dialect)
    if fixed:
        for row in rows:
            row.update(fixed)
    params: list[Any] = rows if order is None else list(map(_getter(order), rows))
    conn.exec_driver_sql(sql, params)


@functools.cache
def _getter(order: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """A row's values in ``order`` (C ``itemgetter``: a batch has ~1,000 rows)."""
    if len(order) == 1:
        return lambda row: (row[order[0]],)
    return operator.itemgetter(*order)


def loads(text: str | bytes) -> Any:
    """A JSON column's value (orjson: these are read on every request)."""
    return orjson.loads(text)
