"""Milvus backend: Milvus Lite (``milvus:///abs/path.db``) and a Milvus server (``milvus://host:19530``).

Over 500 lines by design: one module per backend, and this one implements the whole
:class:`stores.base.VectorStore` contract (collections, aliases, upsert/delete, ANN and exact search,
index builds, filters) for one engine; its mapping and filter translation are in
:mod:`stores.milvus_mapping`.

Collections: ``id`` VARCHAR(512) primary key, ``vector`` FLOAT_VECTOR(dim), ``payload`` JSON
(:mod:`stores.milvus_mapping`). Reads use ``Strong`` consistency by default, so they see every
earlier write. On a server a Strong read waits for the next time tick (~200 ms per search with the
default ``timeTickInterval``); ``?consistency=Session`` in the URL keeps read-your-writes for this
process's own writes without that wait (writes of other processes show up within a tick or so;
pymilvus records no timestamp for deletes, so after a delete the next read is Strong).
Filters compile to escaped Milvus expressions (:mod:`stores.milvus_expr`).

Scores are higher-is-better: ``cosine`` similarity, ``ip`` inner product, and for ``l2`` the
negated Euclidean distance (Milvus ``L2`` answers *squared* distances; we take the root so that
scores agree with the other backends).

Indexes: a new collection (and one whose index was dropped) has an exact ``FLAT`` index named
``exact`` (Milvus cannot load a collection without one); :meth:`MilvusStore.describe_index`
reports it as ``None``. Built indexes are named ``vector_idx`` and keep their query-time
parameters in a ``quarry_search`` index parameter. Milvus Lite 2.5.1 builds only ``FLAT`` and
``IVF_FLAT`` (it refuses HNSW, IVF_PQ and DiskANN); the 2.3 server builds all five kinds, but its
DiskANN build stalls (bounded by ``timeout_s``, then rolled back). A rebuild releases the
collection, so searches fail until it ends: use an alias swap for zero-downtime reindexing.

Filtered searches: routed by the rows the filter matches, whatever its form
(:class:`stores.routing.FilterRouter`: a ``count(*)`` with the filter read ``Eventually``, cached
per filter). At most the limit (``StoreSettings.exact_filter_rows``, by default
``max(1000, sqrt(13 * top_k * n))``): the built index searched exhaustively over the rows the
filter lets through (:func:`stores.milvus_mapping.exhaustive_params`: IVF ``nprobe = nlist``,
HNSW ``ef`` raised to the matching rows, where knowhere brute-forces anyway below 7 % of rows
passing). Above it: the index's own parameters, and any query that comes back short of
``top_k`` is re-run exhaustively. ``search_params["exact"]`` (bool) forces either route. An
``$or`` of equalities on one field is compiled as one ``in`` (:func:`stores.filters.canonical`):
on Lite (20k rows) ten ORed JSON tests took 12-14 ms a query, 5.5-6.6 ms as one ``in``.

Aliases: native on a server; a side table on Lite (:mod:`stores.milvus_aliases`).

Processes and threads: a Lite file can be opened by one process at a time (a second one gets
``StoreUnavailable``); closing the last store of a file stops its embedded server and frees the
file. One store may be shared by the threads of a server: gRPC channels are thread-safe and the
in-process caches are guarded by a lock. On Lite, collection infos and index specs are cached in
process (the only process); on a server they are read per call, so other writers are seen.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version as package_version
from pathlib import Path
from typing import IO, Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import numpy as np

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    ConfigError,
    IndexBuildFailed,
    InvalidQuery,
    InvalidRequest,
    StoreUnavailable,
    UnsupportedIndex,
    missing_extra,
)
from stores.base import (
    FloatMatrix,
    IndexKind,
    IndexSpec,
    Metric,
    ScoredId,
    StoreCapabilities,
    VectorRecord,
    exact_top_k,
)
from stores.filters import Filter, canonical
from stores.routing import FilterRouter

try:
    from pymilvus import MilvusClient, MilvusException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("pymilvus", "milvus-server") from exc

from stores import milvus_fastpath
from stores.milvus_aliases import META_COLLECTION, Aliases, LiteAliases, ServerAliases
from stores.milvus_expr import compile_filter, decode_id, encode_id, ids_expr
from stores.milvus_mapping import (
    BUILT_INDEX,
    EXACT_INDEX,
    METRICS,
    READ_S,
    RETRY_S,
    WRITE_S,
    CollectionInfo,
    exhaustive_params,
    hits_from_arrays,
    index_params,
    info_from,
    new_schema,
    query_matrix,
    spec_from,
    to_hits,
    to_record,
    to_rows,
    wrapped,
)
from stores.routing import scanned_ids

T = TypeVar("T")
LITE_KINDS: frozenset[IndexKind] = frozenset({"FLAT", "IVF_FLAT"})
SERVER_KINDS: frozenset[IndexKind] = frozenset({"FLAT", "HNSW", "IVF_FLAT", "IVF_PQ", "DISKANN"})
_BATCH = 1000
_MAX_TOP_K = 16384
_POLL_S = 0.2
_NAME = re.compile(r"\A[A-Za-z_][A-Za-z0-9_]{0,254}\Z")


class MilvusStore:
    """:class:`~stores.base.VectorStore` on Milvus Lite or a Milvus server (via ``pymilvus``)."""

    def __init__(
        self,
        client: Any,
        *,
        lite: bool,
        uri: str,
        consistency: str = "Strong",
        router: FilterRouter | None = None,
    ) -> None:
        """Wrap a connected ``pymilvus.MilvusClient``; use :meth:`from_url` instead.

        ``router`` routes filtered searches by the rows they match (module docstring; default:
        a :class:`~stores.routing.FilterRouter` with its defaults).
        """
        self.router = router or FilterRouter()
        self._client = client
        self._consistency = consistency
        self._lite = lite
        self._uri = uri
        self._lock = threading.Lock()
        self._infos: dict[str, CollectionInfo] = {}
        self._specs: dict[str, IndexSpec | None] = {}
        self._closed = False
        self._strong_next: set[str] = set()
        self._aliases: Aliases = LiteAliases(client) if lite else ServerAliases(client)
        self._fast_ids = milvus_fastpath.available(client)  # ids/scores without pymilvus' Hit objects

    @classmethod
    def from_url(cls, url: str, router: FilterRouter | None = None) -> MilvusStore:
        """Open ``milvus:///abs/path.db`` (Milvus Lite) or ``milvus://host:port`` (server).

        The query may set the read consistency: ``?consistency=Strong`` (default), ``Session``,
        ``Bounded`` or ``Eventually``.

        Raises:
            ConfigError: The URL names neither a path nor a host, or an unknown consistency.
            StoreUnavailable: The server cannot be reached, or another process holds the Lite file.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() != "milvus":
            raise ConfigError(f"not a Milvus URL: {url!r}")
        consistency = _consistency(parts.query)
        if parts.netloc:
            uri, lite = f"http://{parts.hostname}:{parts.port or 19530}", False
        elif parts.path.endswith(".db"):
            Path(parts.path).parent.mkdir(parents=True, exist_ok=True)
            uri, lite = parts.path, True
        else:
            raise ConfigError(f"a Milvus URL needs a host or a path ending in .db: {url!r}")
        if lite:
            _lite_acquire(uri)  # before MilvusClient starts the Lite server
        try:
            # A private connection alias: closing this store must not close another's channel.
            client = MilvusClient(uri, timeout=30, alias=f"quarry-{uuid.uuid4().hex}")
        except Exception as exc:
            if lite:
                _lite_release(uri)
            hint = " (is another process using this Milvus Lite file?)" if lite else ""
            raise StoreUnavailable(f"cannot open Milvus at {uri}{hint}: {exc}") from exc
        try:
            return cls(client, lite=lite, uri=uri, consistency=consistency, router=router)
        except Exception:
            client.close()
            if lite:
                _lite_release(uri)
            raise

    # -- collections -----------------------------------------------------------------------

    def capabilities(self) -> StoreCapabilities:
        """Index kinds: Lite 2.5.1 builds FLAT/IVF_FLAT; server 2.3 adds HNSW, IVF_PQ, DiskANN."""
        if self._lite:
            return StoreCapabilities(
                engine="milvus-lite",
                version=package_version("milvus-lite"),
                index_kinds=LITE_KINDS,
                max_dim=32768,
                notes="Milvus Lite 2.5.1 builds only FLAT and IVF_FLAT (no HNSW, IVF_PQ, DiskANN)",
            )
        version = self._call("get_server_version", lambda: str(self._client.get_server_version(timeout=RETRY_S)))
        return StoreCapabilities(
            engine="milvus",
            version=version,
            index_kinds=SERVER_KINDS,
            max_dim=32768,
            notes="Milvus 2.3 DiskANN builds stall; every build is bounded by a timeout",
        )

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create an empty collection with an exact FLAT index, loaded.

        Raises:
            CollectionExists: A collection or alias with this name exists.
            InvalidRequest: ``dim`` < 1 or an unknown metric.
        """
        if dim < 1 or metric not in METRICS:
            raise InvalidRequest(f"invalid collection spec: dim={dim}, metric={metric!r}")
        _check_name(name)
        if name == META_COLLECTION or self.has_collection(name):
            raise CollectionExists(name)
        schema = new_schema(dim, metric)
        index = index_params(self._client, EXACT_INDEX, "FLAT", metric)
        with wrapped("create_collection"):
            self._client.create_collection(
                name, schema=schema, index_params=index, consistency_level="Strong", timeout=WRITE_S
            )
        with self._lock:
            self._infos[name] = CollectionInfo(name, dim, metric)
            self._specs[name] = None

    def drop_collection(self, name: str) -> None:
        """Drop a physical collection and the aliases pointing at it; missing is not an error.

        An alias name is not dropped through (use :meth:`drop_alias`).
        """
        if name not in self._physical():
            return
        for alias in self._aliases.of(name):
            self._aliases.remove(alias)
        with wrapped("drop_collection", name):
            self._client.drop_collection(name, timeout=WRITE_S)
        with self._lock:
            self._infos.pop(name, None)
            self._specs.pop(name, None)
        self.router.forget(name)

    def has_collection(self, name: str) -> bool:
        """Whether a collection or an alias with this name exists."""
        return name in self._physical() or self._aliases.target(name) is not None

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted (the Lite alias table is hidden)."""
        return sorted(self._physical())

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors (``name`` may be an alias)."""
        return self._info(name).dim

    # -- records ---------------------------------------------------------------------------

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id (the last of duplicate ids in one call wins).

        Batches of 1000 rows; every record is validated before the first batch is sent.

        Raises:
            DimensionMismatch: A vector has the wrong dimension; nothing is written.
            InvalidDocument: A non-finite vector, or an id empty or over 512 bytes encoded.
        """
        info = self._info(name)
        rows = to_rows(records, info)
        for start in range(0, len(rows), _BATCH):
            with wrapped("upsert", name):
                self._client.upsert(info.name, rows[start : start + _BATCH], timeout=WRITE_S)
        self.router.forget(info.name)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        info = self._info(name)
        keys = list(dict.fromkeys(encode_id(i) for i in ids))
        for start in range(0, len(keys), _BATCH):
            with wrapped("delete", name):
                self._client.delete(info.name, filter=ids_expr(keys[start : start + _BATCH]), timeout=WRITE_S)
        self._deleted(info.name)

    def check_filter(self, flt: Filter) -> None:
        """Refuse, before any search runs, a filter this engine cannot compile (see ``Quarry._target``).

        Raises:
            InvalidFilter: See :func:`stores.milvus_expr.compile_filter` (on Lite: a string with a
                line break).
        """
        compile_filter(flt, lite=self._lite, scan=lambda _cond: [])

    def _expr(self, info: CollectionInfo, flt: Filter | None) -> str:
        """``flt`` compiled, its ``$ne``/``$nin``/``$exists``/``$prefix`` resolved by a payload scan."""
        if flt is None:
            return ""

        def scan(cond: Filter) -> list[str]:
            return scanned_ids(cond, self._payloads(info), self.router.max_scan_ids, "Milvus")

        return compile_filter(flt, lite=self._lite, scan=scan)

    def _payloads(self, info: CollectionInfo) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every ``(record id, payload)`` of a collection: one query when it fits a page, else in pages.

        A collection of fewer than ``_BATCH`` records is read by one ``query`` (one round trip,
        ~3 ms; a Strong one waits for one time tick); a larger one by ``query_iterator``, whose
        three or more round trips each wait for a tick on the 2.3 server (0.6-1.0 s per scan of
        150 records), so a filter's id-set route costs a quarter of that.
        """
        level = self._level(info.name)
        with wrapped("query", info.name):
            rows = self._client.query(
                info.name, filter="", output_fields=["payload"], limit=_BATCH, consistency_level=level,
                timeout=READ_S,
            )
        if len(rows) < _BATCH:
            yield from ((decode_id(row["id"]), row.get("payload") or {}) for row in rows)
            return
        with wrapped("query", info.name):
            pages = self._client.query_iterator(
                info.name, batch_size=_BATCH, filter="", output_fields=["payload"], consistency_level=level
            )
            try:
                while rows := pages.next():
                    yield from ((decode_id(row["id"]), row.get("payload") or {}) for row in rows)
            finally:
                pages.close()

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``.

        Raises:
            InvalidFilter: The filter cannot be compiled (see :mod:`stores.milvus_expr`).
        """
        info = self._info(name)
        expr = self._expr(info, flt)
        with wrapped("delete", name):
            self._client.delete(info.name, filter=expr, timeout=WRITE_S)
        self._deleted(info.name)

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id in the order of ``ids`` (missing ids skipped, duplicates once)."""
        info = self._info(name)
        keys = list(dict.fromkeys(encode_id(i) for i in ids))
        found: dict[str, VectorRecord] = {}
        level = self._level(info.name)
        for start in range(0, len(keys), _BATCH):
            with wrapped("get", name):
                rows = self._client.query(
                    info.name,
                    consistency_level=level,
                    filter=ids_expr(keys[start : start + _BATCH]),
                    output_fields=["id", "vector", "payload"],
                    timeout=READ_S,
                )
            found.update((row["id"], to_record(row)) for row in rows)
        self._settled(info.name, level)
        return [found[k] for k in keys if k in found]

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt``."""
        info = self._info(name)
        expr = self._expr(info, flt)
        level = self._level(info.name)
        with wrapped("count", name):
            rows = self._client.query(
                info.name, filter=expr, output_fields=["count(*)"], consistency_level=level, timeout=READ_S
            )
        self._settled(info.name, level)
        return int(rows[0]["count(*)"])

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
        """Batched k-NN search inside Milvus (filters applied by the engine).

        Args:
            name: Collection or alias.
            queries: ``(n, dim) float32`` (L2-normalised for cosine).
            top_k: Hits per query, ``1..16384``.
            flt: Optional payload filter.
            search_params: Overrides of the index's query-time parameters (``ef``, ``nprobe``,
                ``search_list``); HNSW ``ef`` is raised to at least ``top_k``.
            with_payload: ``False``: no output fields, so Milvus reads and sends ids and scores only.

        Returns:
            ``n`` lists of at most ``top_k`` hits, best first (see the module doc for scores).

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``top_k`` out of range or ``queries`` not a 2-d matrix.
            InvalidFilter: The filter cannot be compiled.
        """
        info = self._info(name)
        matrix = query_matrix(queries, info)
        if not 1 <= top_k <= _MAX_TOP_K:
            raise InvalidQuery(f"top_k must be in 1..{_MAX_TOP_K}, got {top_k}")
        flt = canonical(flt) if flt is not None else None
        expr = self._expr(info, flt)
        overrides = dict(search_params or {})
        forced = overrides.pop("exact", None)
        if forced is not None and not isinstance(forced, bool):
            raise InvalidQuery(f"search parameter exact must be true or false, got {forced!r}")
        spec = self._index_spec(info)
        base = self._search_params(info, top_k, overrides)
        indexed = spec is not None and spec.kind != "FLAT"
        route, rows = ("exact" if forced else "index"), 1000
        if flt is not None and indexed and forced is None:
            decision = self.router.decide(
                info.name, flt, top_k, lambda: self._count_now(info, ""), lambda _cap: self._count_now(info, expr)
            )
            route, rows = decision.route, decision.matching
        exhaustive = exhaustive_params(spec, base, top_k, rows) if spec is not None and indexed else None
        level = self._level(info.name)
        chosen = exhaustive if route == "exact" and exhaustive is not None else base
        hits = self._search_batches(name, info, matrix, top_k, expr, chosen, level, with_payload)
        short = [i for i, h in enumerate(hits) if len(h) < top_k]
        if short and flt is not None and exhaustive is not None and route == "index":
            redo = self._search_batches(name, info, matrix[short], top_k, expr, exhaustive, level, with_payload)
            for i, again in zip(short, redo, strict=True):
                hits[i] = again
        self._settled(info.name, level)
        return hits

    def search_exact(
        self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None
    ) -> list[list[ScoredId]]:
        """Exact k-NN: a FLAT search, IVF_FLAT with ``nprobe = nlist``, else a scan of the vectors.

        A collection without a built index (or with FLAT) is searched through its FLAT index, and
        IVF_FLAT probing every list scores every row; both run in the engine. HNSW, IVF_PQ and
        DiskANN have no exact setting, so their stored vectors (those ``flt`` matches) are read
        with a query iterator and ranked in numpy: O(rows x dim) per batch of queries.
        """
        info = self._info(name)
        matrix = query_matrix(queries, info)
        if not 1 <= top_k <= _MAX_TOP_K:
            raise InvalidQuery(f"top_k must be in 1..{_MAX_TOP_K}, got {top_k}")
        spec = self._index_spec(info)
        if spec is None or spec.kind in ("FLAT", "IVF_FLAT"):
            return self.search(name, matrix, top_k, flt, {"exact": True}, with_payload=False)
        expr = compile_filter(canonical(flt), lite=self._lite) if flt is not None else ""
        ids: list[str] = []
        vectors: list[Any] = []
        with wrapped("search_exact", name):
            rows = self._client.query_iterator(
                info.name, batch_size=_BATCH, filter=expr, output_fields=["id", "vector"], timeout=READ_S
            )
            try:
                while batch := rows.next():
                    ids.extend(decode_id(row["id"]) for row in batch)
                    vectors.extend(row["vector"] for row in batch)
            finally:
                rows.close()
        stored = np.asarray(vectors, dtype=np.float32).reshape(-1, info.dim)
        return exact_top_k(matrix, stored, ids, top_k, info.metric)

    def _count_now(self, info: CollectionInfo, expr: str) -> int:
        """Rows matching ``expr`` (all with ``""``), read ``Eventually``: a routing estimate."""
        with wrapped("count", info.name):
            rows = self._client.query(
                info.name, filter=expr, output_fields=["count(*)"], consistency_level="Eventually", timeout=READ_S
            )
        return int(rows[0]["count(*)"])

    def _search_batches(  # noqa: PLR0913 - one search call's parts
        self,
        name: str,
        info: CollectionInfo,
        matrix: FloatMatrix,
        top_k: int,
        expr: str,
        search_params: dict[str, Any],
        level: str,
        with_payload: bool,
    ) -> list[list[ScoredId]]:
        params = {"metric_type": METRICS[info.metric], "params": search_params}
        hits: list[list[ScoredId]] = []
        for start in range(0, matrix.shape[0], _BATCH):
            data = matrix[start : start + _BATCH].tolist()
            retry_s = READ_S
            if not with_payload and self._fast_ids:
                with wrapped("search", name):
                    rows = milvus_fastpath.search_ids(
                        self._client, info.name, data, top_k, expr, params, level, timeout_s=READ_S
                    )
                if rows is not None:
                    hits.extend(hits_from_arrays(ids, scores, info.metric) for ids, scores in rows)
                    continue
                retry_s = RETRY_S
            with wrapped("search", name):
                raw = self._client.search(
                    info.name,
                    consistency_level=level,
                    data=data,
                    limit=top_k,
                    filter=expr,
                    output_fields=["payload"] if with_payload else [],
                    search_params=params,
                    timeout=retry_s,
                )
            hits.extend(to_hits(raw, info.metric, with_payload=with_payload))
        return hits

    # -- indexes ---------------------------------------------------------------------------

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Flush, replace the index with ``spec`` and wait until every row is indexed and loaded.

        Raises:
            UnsupportedIndex: The engine cannot build ``spec.kind``, the metric differs from the
                collection's, or Milvus rejects the parameters (raised before any waiting).
            IndexBuildFailed: The build failed or did not finish (and load) within
                ``timeout_s``; the partial index was dropped and exact search restored.
        """
        info = self._info(name)
        self._check_spec(info, spec)
        deadline = time.monotonic() + timeout_s
        try:  # seal the growing segments, so that the index covers every row
            self._client.flush(info.name, timeout=_left(deadline))
        except Exception as exc:
            raise IndexBuildFailed(f"flushing {info.name!r} before the build failed", detail=str(exc)) from exc
        self._unindex(info)
        index = index_params(self._client, BUILT_INDEX, spec.kind, spec.metric, spec.params, spec.search_params)
        try:  # sync=False: pymilvus would otherwise wait for the build without a bound
            self._client.create_index(info.name, index, timeout=_left(deadline), sync=False)
        except MilvusException as exc:
            self._restore_exact(info)
            raise UnsupportedIndex(f"Milvus refused {spec.kind} {spec.params}: {exc}") from exc
        try:
            self._wait_built(info, spec.kind, deadline)
            self._client.load_collection(info.name, timeout=_left(deadline))
        except Exception as exc:
            self._rollback(info)
            if isinstance(exc, IndexBuildFailed):
                raise
            raise IndexBuildFailed(f"{spec.kind} on {info.name!r} did not load", detail=str(exc)) from exc

    def describe_index(self, name: str) -> IndexSpec | None:
        """The built index, or ``None`` when the collection only has the exact FLAT index."""
        info = self._info(name)
        with wrapped("describe_index", name):
            if BUILT_INDEX not in self._client.list_indexes(info.name, timeout=READ_S):
                return None
            raw = self._client.describe_index(info.name, BUILT_INDEX, timeout=READ_S)
        return spec_from(raw, info.metric)

    def drop_index(self, name: str) -> None:
        """Drop the built index; the collection falls back to exact (FLAT) search."""
        info = self._info(name)
        with wrapped("list_indexes", name):
            built = BUILT_INDEX in self._client.list_indexes(info.name, timeout=READ_S)
        if built:
            self._rollback(info)

    # -- aliases ---------------------------------------------------------------------------

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at the physical ``collection``, creating or atomically swapping it.

        Raises:
            CollectionNotFound: ``collection`` is not a physical collection.
            CollectionExists: ``alias`` is the name of a physical collection.
        """
        _check_name(alias)
        physical = self._physical()
        if collection not in physical:
            raise CollectionNotFound(collection)
        if alias in physical or alias == META_COLLECTION:
            raise CollectionExists(alias)
        self._aliases.point(alias, collection)

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        if self._aliases.target(alias) is not None:
            self._aliases.remove(alias)

    def resolve(self, name: str) -> str:
        """The physical collection ``name`` refers to (``name`` itself if it is not an alias)."""
        return self._aliases.target(name) or name

    def close(self) -> None:
        """Close the gRPC channel; stop the embedded Lite server when this was its last user.

        Stopping the Lite server releases its file, so another process may open it afterwards.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._client.close()
        if self._lite:
            _lite_release(self._uri)

    # -- internals -------------------------------------------------------------------------

    def _call(self, op: str, fn: Callable[[], T], name: str | None = None) -> T:
        with wrapped(op, name):
            return fn()

    def _physical(self) -> set[str]:
        names = self._call("list_collections", lambda: self._client.list_collections(timeout=RETRY_S))
        return {n for n in names if n != META_COLLECTION}

    def _info(self, name: str) -> CollectionInfo:
        physical = self.resolve(name) if self._lite else name  # a server resolves aliases
        with self._lock:
            cached = self._infos.get(physical) if self._lite else None
        if cached is not None:
            return cached
        if physical == META_COLLECTION:
            raise CollectionNotFound(name)
        with wrapped("describe_collection", name):
            info = info_from(self._client.describe_collection(physical, timeout=RETRY_S))
        with self._lock:
            self._infos[info.name] = info
        return info

    def _deleted(self, name: str) -> None:
        self.router.forget(name)
        # pymilvus records no timestamp for deletes, so a Session read could miss our own delete:
        # the next read of the collection is Strong (after it, the server's tsafe is past it).
        if self._consistency != "Strong":
            with self._lock:
                self._strong_next.add(name)

    def _level(self, name: str) -> str:
        with self._lock:
            return "Strong" if name in self._strong_next else self._consistency

    def _settled(self, name: str, level: str) -> None:
        if level == "Strong" and self._consistency != "Strong":
            with self._lock:
                self._strong_next.discard(name)

    def _check_spec(self, info: CollectionInfo, spec: IndexSpec) -> None:
        kinds = LITE_KINDS if self._lite else SERVER_KINDS
        if spec.kind not in kinds:
            engine = "Milvus Lite" if self._lite else "this Milvus server"
            raise UnsupportedIndex(f"{engine} cannot build {spec.kind}; it builds {', '.join(sorted(kinds))}")
        if spec.metric != info.metric:
            raise UnsupportedIndex(
                f"index metric {spec.metric!r} differs from the metric {info.metric!r} of collection {info.name!r}"
            )

    def _search_params(self, info: CollectionInfo, top_k: int, overrides: dict[str, Any]) -> dict[str, Any]:
        spec = self._index_spec(info)
        params = dict(spec.search_params) if spec is not None else {}
        params.update(overrides)
        if spec is not None and spec.kind == "HNSW":
            params["ef"] = max(int(params.get("ef", 0)), top_k)
        elif spec is None or spec.kind == "FLAT":
            params = {}
        return params

    def _index_spec(self, info: CollectionInfo) -> IndexSpec | None:
        with self._lock:
            if self._lite and info.name in self._specs:
                return self._specs[info.name]
        spec = self.describe_index(info.name)
        with self._lock:
            self._specs[info.name] = spec
        return spec

    def _unindex(self, info: CollectionInfo) -> None:
        with self._lock:
            self._specs.pop(info.name, None)
        with wrapped("drop_index", info.name):
            self._client.release_collection(info.name, timeout=WRITE_S)
            for index_name in self._client.list_indexes(info.name, timeout=READ_S):
                self._client.drop_index(info.name, index_name, timeout=WRITE_S)

    def _restore_exact(self, info: CollectionInfo) -> None:
        index = index_params(self._client, EXACT_INDEX, "FLAT", info.metric)
        with wrapped("restore exact index", info.name):
            self._client.create_index(info.name, index, timeout=60)
            self._client.load_collection(info.name, timeout=120)

    def _rollback(self, info: CollectionInfo) -> None:
        self._unindex(info)
        self._restore_exact(info)

    def _wait_built(self, info: CollectionInfo, kind: str, deadline: float) -> None:
        while True:
            with wrapped("describe_index", info.name):
                raw = self._client.describe_index(info.name, BUILT_INDEX, timeout=READ_S)
            state = str(raw.get("state", ""))
            if state == "Failed":
                reason = raw.get("index_state_fail_reason", "")
                raise IndexBuildFailed(f"{kind} build on {info.name!r} failed: {reason}")
            if state == "Finished" and int(raw.get("pending_index_rows", 0)) == 0:
                return
            if time.monotonic() >= deadline:
                raise IndexBuildFailed(
                    f"{kind} build on {info.name!r} stalled: {raw.get('indexed_rows')}/"
                    f"{raw.get('total_rows')} rows indexed, state {state!r} at the timeout; "
                    "the partial index was dropped"
                )
            time.sleep(_POLL_S)


def _consistency(query: str) -> str:
    levels = {"strong": "Strong", "session": "Session", "bounded": "Bounded", "eventually": "Eventually"}
    raw = parse_qs(query).get("consistency", ["Strong"])[-1]
    if raw.lower() not in levels:
        raise ConfigError(f"unknown Milvus consistency {raw!r}; use one of {', '.join(levels.values())}")
    return levels[raw.lower()]


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"invalid Milvus collection or alias name {name!r}: use letters, digits and '_', "
            "starting with a letter or '_' (at most 255 characters)"
        )


def _left(deadline: float) -> float:
    """Seconds left until ``deadline`` (at least one), as a per-RPC timeout."""
    return max(deadline - time.monotonic(), 1.0)


_LITE_USERS: dict[str, int] = {}
_LITE_FILES: dict[str, IO[str]] = {}  # the held lock file of each Lite path this process serves
_LITE_LOCK = threading.Lock()


def _lite_acquire(path: str) -> None:
    """Count a store on the Lite file ``path``; the first one locks it for this process.

    Milvus Lite serves one process. Its own lock is not enough: a process refused by it unlinks
    the lock file on the way out (milvus-lite 2.4/2.5 ``Server.stop``), so the next process
    locks a new file and opens the database beside its owner. Quarry's lock file
    (``<db>.quarry-lock``, never removed, holding the owner's pid) is taken first.

    Raises:
        StoreUnavailable: Another process holds the file.
    """
    with _LITE_LOCK:
        if path not in _LITE_FILES:
            try:
                lock = open(f"{path}.quarry-lock", "a+", encoding="utf-8")  # noqa: SIM115 - held while served
            except OSError as exc:
                raise StoreUnavailable(f"cannot open the Milvus Lite file {path}: {exc.strerror or exc}") from exc
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.seek(0)
                owner = lock.read().strip() or "unknown"
                lock.close()
                raise StoreUnavailable(
                    f"the Milvus Lite file {path} is in use by another process (pid {owner}, e.g. a running "
                    "`quarry serve`): Milvus Lite serves one process. Stop it, send documents through its "
                    "REST API, or use a Milvus server (milvus://host:19530)",
                    retry_after_s=1.0,
                ) from None
            lock.truncate(0)
            lock.write(str(os.getpid()))
            lock.flush()
            _LITE_FILES[path] = lock
        _LITE_USERS[path] = _LITE_USERS.get(path, 0) + 1


def _lite_release(path: str) -> None:
    """Stop the in-process Milvus Lite server of ``path`` when its last store closes."""
    with _LITE_LOCK:
        _LITE_USERS[path] = _LITE_USERS.get(path, 1) - 1
        if _LITE_USERS[path] > 0:
            return
        del _LITE_USERS[path]
        lock = _LITE_FILES.pop(path, None)
    from milvus_lite.server_manager import server_manager_instance

    try:
        server_manager_instance.release_server(path)
    finally:
        if lock is not None:
            lock.close()  # unlocks: another process may open the file now
