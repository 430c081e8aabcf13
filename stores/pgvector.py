"""PostgreSQL + pgvector backend: ``postgresql://user@host:port/db[?schema=quarry]``.

Over 500 lines by design: one module per backend implementing the whole
:class:`stores.base.VectorStore` contract for one engine (tables, aliases, HNSW/IVF builds,
SQL filters, exact search).

Layout, all inside one schema (default ``quarry``; ``?schema=`` in the URL picks another, which
is how tests isolate themselves on a shared server):

* ``c_<name>``: one table per collection, ``(id text PRIMARY KEY, embedding vector(dim),
  payload jsonb)``, with a GIN ``jsonb_path_ops`` index on ``payload`` for the filters;
* ``meta_collections``: ``name, dim, metric, index_spec jsonb`` (the index as built);
* ``meta_aliases``: ``alias -> collection``; a swap is one ``UPSERT`` in one transaction.

Indexes (pgvector >= 0.8): HNSW and IVFFlat on ``embedding``, or on ``embedding::halfvec(dim)``
with ``params={"halfvec": True}`` (half the memory, up to 4000 dims); FLAT means no index (an
exact scan).

Filtered searches: every filter is routed by the number of rows it matches, whatever
its form (:class:`stores.routing.FilterRouter`): a ``count(*)`` of the matching rows, capped
with ``LIMIT`` at the exact-scan limit plus one and kept per ``(collection, filter)`` for a few
seconds, through the payload GIN index when it serves the filter (``$eq``/``$in``) and a scan
otherwise (ranges). At most the limit (``StoreSettings.exact_filter_rows``, by default
``max(1000, sqrt(13 * top_k * n))``, about 3,600 of 100k for k = 10): the matching rows are read
once per batch and every query ranks them exactly. Above it: the vector index with iterative
scans (``hnsw.iterative_scan``, ``ivfflat.iterative_scan``), and a query that still comes back
short of ``top_k`` is re-run as an exact scan, so a search returns fewer than ``top_k`` hits only
when fewer rows match. Before, only GIN-served filters were counted: the same rows written as a
range walked the graph (0.1 % of 20k x 32: 126 ms against 16 ms for the equality).

Connections come from a thread-safe :class:`psycopg_pool.ConnectionPool`. Every value is a
bound parameter (see :mod:`stores.pgvector_sql`). Start a local server with
``scripts/services/postgres.sh start`` (URL ``postgresql://postgres@127.0.0.1:5433/quarry``).
"""

from __future__ import annotations

import select
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    DimensionMismatch,
    IndexBuildFailed,
    InvalidQuery,
    InvalidRequest,
    QuarryError,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    missing_extra,
)
from stores import pgvector_sql as q
from stores.base import FloatMatrix, IndexSpec, Metric, ScoredId, StoreCapabilities, VectorRecord, redact_url
from stores.filters import Filter, canonical
from stores.routing import FilterRouter

try:
    import psycopg
    from pgvector.psycopg import register_vector
    from psycopg import sql
    from psycopg.types.json import Jsonb
    from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise missing_extra(exc.name or "psycopg", "pgvector") from exc

Conn = psycopg.Connection[tuple[Any, ...]]
UPSERT_BATCH = 2000  # rows per INSERT statement (all batches share one transaction)
GIN_MERGE_ROWS = 1000  # an upsert of this many rows merges the payload index's pending list
_LOCK_KEY = 0x5175617272  # pg_advisory_xact_lock key serialising metadata changes


@dataclass(frozen=True)
class _Collection:
    name: str
    dim: int
    metric: Metric
    index: IndexSpec | None


class PgVectorStore:
    """A :class:`~stores.base.VectorStore` on PostgreSQL with pgvector.

    Args:
        conninfo: libpq connection string or URL (without the ``schema`` query parameter).
        schema: Schema that holds Quarry's tables; created if missing.
        pool_max: Most connections the pool opens.
        connect_timeout_s: Seconds to wait for the first connection (and for a fresh one after
            a lost connection). A call waits at most 5 s for a pooled connection
            (``StoreUnavailable`` after that); a lost connection is re-made with backoff for 5 s,
            then on demand.
        maintenance_work_mem: Memory for index builds (``SET LOCAL maintenance_work_mem``).
        exact_fallback: Re-run, as an exact scan, any query an index scan left short of
            ``top_k`` (keeps the "fewer only when fewer match" contract; off only to measure
            the index alone).
        router: Routes filtered searches by the rows they match (default: a
            :class:`~stores.routing.FilterRouter` with its defaults).

    Raises:
        StoreUnavailable: The server cannot be reached.
        StoreError: The ``vector`` extension is missing and cannot be created.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        schema: str = "quarry",
        pool_max: int = 10,
        connect_timeout_s: float = 10.0,
        maintenance_work_mem: str = "1GB",
        exact_fallback: bool = True,
        router: FilterRouter | None = None,
    ) -> None:
        self._schema = q.check_name(schema, "schema")
        self.router = router or FilterRouter()
        self._maintenance_work_mem = maintenance_work_mem
        self._exact_fallback = exact_fallback
        self._caps: StoreCapabilities | None = None
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._unreachable = False  # the last call lost its connection: probe before using the pool
        self._bootstrap(conninfo, connect_timeout_s)
        self._pool: ConnectionPool[Conn] = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=pool_max,
            kwargs={"connect_timeout": max(1, int(connect_timeout_s))},
            configure=_configure,
            open=False,
            timeout=5.0,
            reconnect_timeout=5.0,
            name="quarry-pgvector",
        )
        try:
            self._pool.open(wait=True, timeout=connect_timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            raise StoreUnavailable(f"PostgreSQL at {redact_url(conninfo)} is unreachable") from exc

    @classmethod
    def from_url(cls, url: str, router: FilterRouter | None = None) -> PgVectorStore:
        """Open a store from ``postgresql://user[:password]@host[:port]/db[?schema=name]``.

        Raises:
            StoreUnavailable: The server cannot be reached.
        """
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        schema = next((v for k, v in query if k == "schema"), "quarry")
        rest = urlencode([(k, v) for k, v in query if k != "schema"])
        return cls(urlunsplit(parts._replace(query=rest)), schema=schema, router=router)

    # ------------------------------------------------------------------ plumbing

    def _bootstrap(self, conninfo: str, timeout_s: float) -> None:
        try:
            with psycopg.connect(conninfo, connect_timeout=max(1, int(timeout_s))) as conn:
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                for stmt in q.schema_ddl(self._schema):
                    conn.execute(stmt)
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"PostgreSQL at {redact_url(conninfo)} is unreachable") from exc
        except psycopg.Error as exc:
            raise StoreError(f"cannot prepare schema {self._schema!r}: {exc}") from exc

    @contextmanager
    def _tx(self, name: str | None = None) -> Iterator[Conn]:
        """One pooled connection in one transaction, with driver errors mapped to Quarry's."""
        if self._unreachable:
            self._probe()
        try:
            with self._checked_out() as conn:
                yield conn
        except QuarryError:
            raise
        except psycopg.errors.UndefinedTable as exc:
            raise CollectionNotFound(name or "?") from exc
        except psycopg.errors.QueryCanceled as exc:  # statement_timeout: this query's failure
            raise StoreTimeout("PostgreSQL cancelled the query at its time limit", detail=str(exc)) from exc
        except (psycopg.OperationalError, PoolTimeout) as exc:
            if _connection_lost(exc):
                self._unreachable = True
            raise StoreUnavailable("PostgreSQL unavailable", detail=str(exc)) from exc
        except (psycopg.Error, PoolClosed) as exc:
            state = getattr(exc, "sqlstate", None)
            raise StoreError(f"PostgreSQL error{f' (SQLSTATE {state})' if state else ''}", detail=str(exc)) from exc

    @contextmanager
    def _checked_out(self) -> Iterator[Conn]:
        """A pooled connection; one the server ended while it sat idle is replaced first.

        A restart ends every idle connection (``FATAL: terminating connection``), and the pool
        would hand them out one by one, each failing its query. Such a connection has something
        to read while idle: it is then checked with a round trip, and when dead it is closed (the
        pool drops it) and :meth:`_probe` runs: refused at once while the server is down, else
        the pool reconnects now. A healthy idle connection costs one ``poll``, not a round
        trip (psycopg_pool's ``check_connection`` at every checkout).
        """
        with self._pool.connection() as conn:
            if not _ended_while_idle(conn):
                yield conn
                return
            conn.close()
        self._unreachable = True
        self._probe()
        with self._pool.connection() as conn:
            yield conn

    def _probe(self) -> None:
        """After a lost connection, try a fresh one before waiting on the pool.

        While the server is down the pool's clients wait its whole ``timeout`` for a connection
        its backoff keeps failing to make; a fresh connection is refused at once. Once the server
        answers, the pool is told to reconnect now instead of at its next backoff step (up to
        ``reconnect_timeout``).

        Raises:
            StoreUnavailable: The server still refuses connections.
        """
        try:
            psycopg.connect(self._conninfo, connect_timeout=max(1, int(self._connect_timeout_s))).close()
        except psycopg.OperationalError as exc:
            reason = " ".join(str(exc).split())  # libpq's message spans lines
            raise StoreUnavailable(
                f"PostgreSQL at {redact_url(self._conninfo)} is unreachable", detail=reason
            ) from exc
        self._unreachable = False
        self._pool.check()

    def _run(
        self,
        conn: Conn,
        template: str,
        params: Sequence[Any] = (),
        *,
        coll: str | None = None,
        where: sql.Composable | None = None,
        binary: bool = False,
    ) -> psycopg.Cursor[tuple[Any, ...]]:
        """Execute a statement template over this store's schema; values stay bound.

        ``{meta}``, ``{aliases}`` and ``{table}`` (the table of ``coll``) become quoted
        identifiers, ``{where}`` the compiled filter condition.
        """
        query = sql.SQL(template).format(
            meta=sql.Identifier(self._schema, "meta_collections"),
            aliases=sql.Identifier(self._schema, "meta_aliases"),
            table=q.table(self._schema, coll) if coll else sql.SQL(""),
            where=where if where is not None else sql.SQL("TRUE"),
        )
        return conn.execute(query, params, binary=binary)

    def _lookup(self, conn: Conn, name: str) -> _Collection:
        row = self._run(
            conn,
            "SELECT name, dim, metric, index_spec FROM {meta} WHERE name = "
            "COALESCE((SELECT collection FROM {aliases} WHERE alias = %s), %s)",
            (name, name),
        ).fetchone()
        if row is None:
            raise CollectionNotFound(name)
        index = None if row[3] is None else IndexSpec(**row[3])
        return _Collection(row[0], int(row[1]), cast(Metric, row[2]), index)

    def _exists(self, conn: Conn, name: str) -> bool:
        row = self._run(
            conn,
            "SELECT EXISTS (SELECT 1 FROM {meta} WHERE name = %s) OR EXISTS (SELECT 1 FROM {aliases} WHERE alias = %s)",
            (name, name),
        ).fetchone()
        return bool(row and row[0])

    # ------------------------------------------------------------------ collections

    def capabilities(self) -> StoreCapabilities:
        """PostgreSQL and pgvector versions; FLAT, HNSW and IVF_FLAT; 2000 dims (vector)."""
        if self._caps is None:
            with self._tx() as conn:
                row = conn.execute(
                    "SELECT current_setting('server_version'), "
                    "(SELECT extversion FROM pg_extension WHERE extname = 'vector')"
                ).fetchone()
            server, ext = row if row else ("?", "?")
            self._caps = StoreCapabilities(
                engine="pgvector",
                version=f"PostgreSQL {server} + pgvector {ext}",
                index_kinds=frozenset({"FLAT", "HNSW", "IVF_FLAT"}),
                max_dim=q.MAX_INDEX_DIM["vector"],
                persistent=True,
                notes=(
                    "HNSW/IVFFlat on vector up to 2000 dims, on halfvec (params halfvec=True) "
                    "up to 4000; no IVF_PQ or DiskANN; filtered queries use iterative scans"
                ),
            )
        return self._caps

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create ``c_<name>`` for ``dim``-dimensional vectors (1-16000).

        Raises:
            InvalidRequest: Bad name, dimension or metric.
            CollectionExists: A collection or alias with this name exists.
        """
        q.check_name(name)
        if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= q.MAX_DIM:
            raise InvalidRequest(f"dim must be an int in [1, {q.MAX_DIM}], got {dim!r}")
        if metric not in q.METRICS:
            raise InvalidRequest(f"metric must be one of {q.METRICS}, got {metric!r}")
        with self._tx(name) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            if self._exists(conn, name):
                raise CollectionExists(name)
            for stmt in q.collection_ddl(self._schema, name, dim):
                conn.execute(stmt)
            self._run(
                conn,
                "INSERT INTO {meta} (name, dim, metric) VALUES (%s, %s, %s)",
                (name, dim, metric),
            )

    def drop_collection(self, name: str) -> None:
        """Drop a physical collection, its data and the aliases pointing at it."""
        if not isinstance(name, str) or not q.COLLECTION_NAME.fullmatch(name):
            return  # such a name cannot have been created
        with self._tx(name) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            gone = self._run(conn, "DELETE FROM {meta} WHERE name = %s RETURNING name", (name,)).fetchone()
            if gone is not None:
                self._run(conn, "DROP TABLE IF EXISTS {table}", coll=name)
        self.router.forget(name)

    def has_collection(self, name: str) -> bool:
        """Whether a collection or an alias named ``name`` exists."""
        with self._tx(name) as conn:
            return self._exists(conn, name)

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted."""
        with self._tx() as conn:
            rows = self._run(conn, "SELECT name FROM {meta}").fetchall()
        return sorted(r[0] for r in rows)

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors."""
        with self._tx(name) as conn:
            return self._lookup(conn, name).dim

    # ------------------------------------------------------------------ records

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id, all in one transaction (last duplicate wins).

        Rows go in ``UPSERT_BATCH`` at a time as three bound arrays (``unnest`` of ids,
        vectors, payloads) with ``ON CONFLICT (id) DO UPDATE``. An upsert of at least
        ``GIN_MERGE_ROWS`` rows then merges the payload GIN index's pending list
        (``gin_clean_pending_list``): every filter lookup reads that list whole, once per
        ``$in`` value, until autovacuum merges it (a 10-value ``$in`` on 20k fresh rows took
        77 ms, 1.3 ms after the merge).

        Raises:
            DimensionMismatch: A vector has the wrong dimension; nothing is written.
            InvalidRequest: A vector holds NaN or infinity, or an id is not a non-empty str.
        """
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            rows = _checked_rows(coll, records)
            for start in range(0, len(rows), UPSERT_BATCH):
                chunk = rows[start : start + UPSERT_BATCH]
                self._run(
                    conn,
                    "INSERT INTO {table} (id, embedding, payload) "
                    "SELECT * FROM unnest(%s::text[], %b::vector[], %b::jsonb[]) "
                    "ON CONFLICT (id) DO UPDATE "
                    "SET embedding = EXCLUDED.embedding, payload = EXCLUDED.payload",
                    ([r[0] for r in chunk], [r[1] for r in chunk], [Jsonb(r[2]) for r in chunk]),
                    coll=coll.name,
                )
            if len(rows) >= GIN_MERGE_ROWS:
                self._run(
                    conn,
                    "SELECT gin_clean_pending_list(to_regclass(quote_ident(%s) || '.' || quote_ident(%s)))",
                    (self._schema, q.index_name(coll.name, "payload")),
                )
        self.router.forget(coll.name)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            self._run(conn, "DELETE FROM {table} WHERE id = ANY(%s::text[])", (list(ids),), coll=coll.name)
        self.router.forget(coll.name)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``.

        Raises:
            InvalidFilter: The filter cannot be compiled.
        """
        cond, params = q.compile_filter(flt)
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            self._run(conn, "DELETE FROM {table} WHERE {where}", params, coll=coll.name, where=cond)
        self.router.forget(coll.name)

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id, in the order of ``ids`` (missing and repeated ids skipped)."""
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            rows = self._run(
                conn,
                "SELECT id, embedding, payload FROM {table} WHERE id = ANY(%s::text[])",
                (list(ids),),
                coll=coll.name,
                binary=True,
            ).fetchall()
        found = {r[0]: VectorRecord(r[0], _to_numpy(r[1]), r[2]) for r in rows}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt``."""
        cond, params = q.compile_filter(flt)
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            row = self._run(
                conn, "SELECT count(*) FROM {table} WHERE {where}", params, coll=coll.name, where=cond
            ).fetchone()
        return int(row[0]) if row else 0

    # ------------------------------------------------------------------ search

    def search(
        self,
        name: str,
        queries: FloatMatrix,
        top_k: int,
        flt: Filter | None = None,
        search_params: dict[str, Any] | None = None,
        *,
        with_payload: bool = True,
    ) -> list[list[ScoredId]]:
        """Batched k-NN in one statement (a LATERAL scan per query row).

        ``search_params`` override the index's: ``ef`` (HNSW ``hnsw.ef_search``, raised to at
        least ``top_k``), ``nprobe`` (``ivfflat.probes``), ``iterative_scan`` (default
        ``relaxed_order``), ``max_scan_tuples``, ``scan_mem_multiplier``, ``max_probes``, and
        ``exact`` (``True``: exact scan; ``False``: the index even for a selective filter;
        unset: chosen per call, see :meth:`_route`). Other keys are ignored (they belong
        to other engines).

        Returns:
            ``n`` lists of at most ``top_k`` hits, best first; scores are cosine similarity,
            inner product, or ``-`` Euclidean distance.

        Raises:
            InvalidQuery: ``queries`` is not 2-D, ``top_k < 1`` or a parameter is out of range.
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
        """
        matrix = np.asarray(queries, dtype=np.float32)
        if matrix.ndim != 2:
            raise InvalidQuery(f"queries must be a 2-D (n, dim) array, got shape {matrix.shape}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
            raise InvalidQuery(f"top_k must be an int >= 1, got {top_k!r}")
        flt = canonical(flt) if flt is not None else None
        cond, cond_params = q.compile_filter(flt)
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            if matrix.shape[1] != coll.dim:
                raise DimensionMismatch(expected=coll.dim, got=matrix.shape[1], collection=name)
            if matrix.shape[0] == 0:
                return []
            index = coll.index or IndexSpec("FLAT")
            params = {**index.search_params, **(search_params or {})}
            route = self._route(conn, coll, index.kind, flt, (cond, cond_params), params, top_k)
            if route == "few":
                stmt = q.candidates_search_sql(self._schema, coll.name, coll.metric, cond, with_payload)
                return _Search(conn, stmt, coll.metric, cond_params, [top_k]).run(list(matrix))
            halfvec = bool(index.params.get("halfvec"))
            stmt = q.search_sql(self._schema, coll.name, coll.dim, coll.metric, halfvec, cond, with_payload)
            if route == "exact":
                _set_local(conn, [("enable_indexscan", "off")])
            else:
                _set_local(conn, q.search_settings(index.kind, params, top_k))
            search = _Search(conn, stmt, coll.metric, [], [*cond_params, top_k])
            hits = search.run(list(matrix))
            short = [i for i, h in enumerate(hits) if len(h) < top_k]
            if short and self._exact_fallback and route == "index":
                _set_local(conn, [("enable_indexscan", "off")])
                for i, redo in zip(short, search.run([matrix[i] for i in short]), strict=True):
                    hits[i] = redo
        return hits

    def search_exact(
        self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None
    ) -> list[list[ScoredId]]:
        """Exact k-NN: :meth:`search` with ``exact=True`` (``SET LOCAL enable_indexscan = off``).

        The HNSW/IVFFlat index is never used: PostgreSQL scans the table (or the rows the payload
        GIN index finds for the filter) and sorts by the distance operator.
        """
        return self.search(name, queries, top_k, flt, {"exact": True}, with_payload=False)

    def _route(
        self,
        conn: Conn,
        coll: _Collection,
        kind: str,
        flt: Filter | None,
        compiled: tuple[sql.Composable, list[Any]],
        params: dict[str, Any],
        top_k: int,
    ) -> str:
        """How to answer: ``"index"`` (vector index), ``"exact"`` (scan) or ``"few"``.

        ``search_params["exact"]`` forces ``exact``/``index``; without an index it is ``exact``.
        A filter that matches at most the router's limit of rows (counted with ``LIMIT``, through
        the payload GIN index when it serves the filter) is ``few``: its rows are read once per
        batch and every query ranks them exactly, which beats walking the graph past the 99 %
        of tuples that do not match. Leaves ``enable_seqscan`` off for a ``few`` route the GIN
        index serves.
        """
        forced = params.get("exact")
        if forced is not None:
            if not isinstance(forced, bool):
                raise InvalidQuery(f"search parameter exact must be true or false, got {forced!r}")
            return "exact" if forced else "index"
        if kind == "FLAT":
            return "exact"
        if flt is None:
            return "index"
        cond, cond_params = compiled
        served = q.index_served(flt)

        def n_rows() -> float:
            row = self._run(
                conn,
                "SELECT c.reltuples FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relname = %s",
                (self._schema, q.table_name(coll.name)),
            ).fetchone()
            return float(row[0]) if row else 0.0

        def count(cap: int) -> int:
            _set_local(conn, [("enable_seqscan", "off" if served else "on")])  # GIN finds the rows
            found = self._run(
                conn,
                "SELECT count(*) FROM (SELECT 1 FROM {table} WHERE {where} LIMIT %s) AS m",
                [*cond_params, cap + 1],
                coll=coll.name,
                where=cond,
            ).fetchone()
            return int(found[0]) if found else 0

        decision = self.router.decide(coll.name, flt, top_k, n_rows, count)
        _set_local(conn, [("enable_seqscan", "off" if served and decision.route == "exact" else "on")])
        return "few" if decision.route == "exact" else "index"

    # ------------------------------------------------------------------ indexes

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Build (or replace) the vector index in one transaction under ``statement_timeout``.

        The new index is built beside the old one, which is dropped and replaced only when the
        build succeeds; a failed or timed-out build rolls the whole transaction back. The index
        uses the collection's metric whatever ``spec.metric`` says (recorded as built).

        Raises:
            UnsupportedIndex: ``IVF_PQ``/``DISKANN`` or bad parameters (before any work).
            IndexBuildFailed: The build failed or ran past ``timeout_s``; nothing changed.
        """
        if timeout_s <= 0:
            raise InvalidRequest(f"timeout_s must be > 0, got {timeout_s!r}")
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            plan = q.plan_index(spec, coll.dim, coll.metric)
            try:
                self._replace_index(conn, coll, plan, timeout_s)
            except psycopg.errors.QueryCanceled as exc:
                raise IndexBuildFailed(
                    f"building {spec.kind} on {name!r} took longer than {timeout_s:g} s; rolled back"
                ) from exc
            except (psycopg.errors.ProgramLimitExceeded, psycopg.errors.OutOfMemory) as exc:
                raise IndexBuildFailed(f"building {spec.kind} on {name!r} failed", detail=str(exc)) from exc

    def _replace_index(self, conn: Conn, coll: _Collection, plan: q.IndexPlan, timeout_s: float) -> None:
        timeout_ms = str(max(1, int(timeout_s * 1000)))
        _set_local(
            conn,
            [
                ("statement_timeout", timeout_ms),
                ("maintenance_work_mem", self._maintenance_work_mem),
            ],
        )
        final, fresh = q.index_name(coll.name), q.index_name(coll.name, "vec_new")
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(self._schema, fresh)))
        if plan.method is not None:
            conn.execute(q.create_index_sql(self._schema, coll.name, plan, coll.dim, coll.metric, fresh))
        conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(self._schema, final)))
        if plan.method is not None:
            conn.execute(
                sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                    sql.Identifier(self._schema, fresh), sql.Identifier(final)
                )
            )
        self._run(
            conn,
            "UPDATE {meta} SET index_spec = %s WHERE name = %s",
            (Jsonb(_spec_doc(plan.spec)), coll.name),
        )

    def describe_index(self, name: str) -> IndexSpec | None:
        """The index as built (``FLAT`` after an explicit FLAT build), or ``None``."""
        with self._tx(name) as conn:
            return self._lookup(conn, name).index

    def drop_index(self, name: str) -> None:
        """Drop the vector index; searches become exact scans."""
        with self._tx(name) as conn:
            coll = self._lookup(conn, name)
            idx = sql.Identifier(self._schema, q.index_name(coll.name))
            conn.execute(sql.SQL("DROP INDEX IF EXISTS {}").format(idx))
            self._run(conn, "UPDATE {meta} SET index_spec = NULL WHERE name = %s", (coll.name,))

    # ------------------------------------------------------------------ aliases

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection`` (resolved), creating or swapping it atomically.

        Raises:
            InvalidRequest: Bad alias name.
            CollectionExists: ``alias`` is the name of a physical collection.
            CollectionNotFound: ``collection`` does not exist.
        """
        q.check_name(alias, "alias")
        with self._tx(collection) as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
            target = self._lookup(conn, collection).name
            if self._run(conn, "SELECT 1 FROM {meta} WHERE name = %s", (alias,)).fetchone():
                raise CollectionExists(alias)
            self._run(
                conn,
                "INSERT INTO {aliases} (alias, collection) VALUES (%s, %s) "
                "ON CONFLICT (alias) DO UPDATE SET collection = EXCLUDED.collection",
                (alias, target),
            )

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        with self._tx(alias) as conn:
            self._run(conn, "DELETE FROM {aliases} WHERE alias = %s", (alias,))

    def resolve(self, name: str) -> str:
        """The collection an alias points at, or ``name`` itself when it is not an alias."""
        with self._tx(name) as conn:
            row = self._run(conn, "SELECT collection FROM {aliases} WHERE alias = %s", (name,)).fetchone()
        return str(row[0]) if row else name

    def close(self) -> None:
        """Close the connection pool."""
        self._pool.close()


# ---------------------------------------------------------------------- helpers


def _ended_while_idle(conn: Conn) -> bool:
    """Whether an idle connection was ended by the server (it has something to read, and a round trip fails).

    ``poll``, not ``select``: a server process may hold more than ``FD_SETSIZE`` (1024) files.
    """
    readable = select.poll()
    readable.register(conn.fileno(), select.POLLIN)
    if not readable.poll(0):
        return False
    try:
        ConnectionPool.check_connection(conn)
    except psycopg.Error:
        return True
    return False


def _connection_lost(exc: Exception) -> bool:
    """Whether an error means the connection or the server is gone (not a query's own failure).

    SQLSTATE class 08 (connection exception), 57P01-57P03 (shutdown, crash, cannot connect now) and
    errors without a SQLSTATE (libpq's own: refused, closed unexpectedly) are; a query cancelled
    by ``statement_timeout`` (57014), a deadlock or a full disk is not.
    """
    if isinstance(exc, PoolTimeout):
        return True
    state = getattr(exc, "sqlstate", None)
    return state is None or state.startswith("08") or state in {"57P01", "57P02", "57P03"}


def _configure(conn: Conn) -> None:
    """Pool hook: register the vector types and load pgvector (so its GUCs are known)."""
    register_vector(conn)
    conn.execute("SELECT NULL::vector")
    conn.commit()


def _checked_rows(
    coll: _Collection, records: Sequence[VectorRecord]
) -> list[tuple[str, np.ndarray[Any, np.dtype[np.float32]], dict[str, Any]]]:
    rows: dict[str, tuple[str, np.ndarray[Any, np.dtype[np.float32]], dict[str, Any]]] = {}
    for rec in records:
        vec = np.asarray(rec.vector, dtype=np.float32)
        if vec.ndim != 1 or vec.shape[0] != coll.dim:
            got = vec.shape[-1] if vec.ndim else 0
            raise DimensionMismatch(expected=coll.dim, got=int(got), collection=coll.name)
        if not np.isfinite(vec).all():
            raise InvalidRequest(f"vector of record {rec.id!r} holds NaN or infinity")
        if not isinstance(rec.id, str) or not rec.id:
            raise InvalidRequest(f"record ids must be non-empty strings, got {rec.id!r}")
        rows[rec.id] = (rec.id, vec, dict(rec.payload))
    return list(rows.values())


def _set_local(conn: Conn, settings: list[tuple[str, str]]) -> None:
    if not settings:
        return
    calls = sql.SQL(", ").join(sql.SQL("set_config(%s, %s, true)") for _ in settings)
    conn.execute(sql.SQL("SELECT {}").format(calls), [x for pair in settings for x in pair])


class _Search:
    """One batched search statement inside a transaction.

    Its parameters are ``[*before, query vectors, *after]``.
    """

    def __init__(self, conn: Conn, stmt: sql.Composed, metric: Metric, before: list[Any], after: list[Any]) -> None:
        self._conn, self._stmt, self._metric = conn, stmt, metric
        self._before, self._after = before, after

    def run(self, vectors: list[Any]) -> list[list[ScoredId]]:
        """Hits for each of ``vectors``, best first."""
        params = [*self._before, vectors, *self._after]
        hits: list[list[ScoredId]] = [[] for _ in vectors]
        for ordinal, rid, dist, payload in self._conn.execute(self._stmt, params):
            hits[int(ordinal) - 1].append(ScoredId(rid, q.score(self._metric, dist), payload))
        return hits


def _to_numpy(value: Any) -> np.ndarray[Any, np.dtype[np.float32]]:
    arr = value.to_numpy() if hasattr(value, "to_numpy") else value
    return np.array(arr, dtype=np.float32)


def _spec_doc(spec: IndexSpec) -> dict[str, Any]:
    return {
        "kind": spec.kind,
        "metric": spec.metric,
        "params": spec.params,
        "search_params": spec.search_params,
    }

