"""Milvus backend: Milvus Lite (``milvus:///abs/path.db``) and a Milvus server (``milvus://host:19530``).

Schema of every collection: ``id`` VARCHAR(512) primary key (the caller's id, ``%XX``-encoded by
:func:`stores.milvus_expr.encode_id`), ``vector`` FLOAT_VECTOR(dim), ``payload`` JSON. The metric
lives in the collection description. Reads use ``Strong`` consistency, so a read sees every
earlier write.

Scores are higher-is-better: ``cosine`` similarity, ``ip`` inner product, and for ``l2`` the
negated Euclidean distance (Milvus ``L2`` returns *squared* distances; we take the root, so the
score matches the other backends).

Indexes: a new collection (and one whose index was dropped) has an exact ``FLAT`` index named
``exact`` (Milvus cannot load a collection without an index); :meth:`MilvusStore.describe_index`
reports it as ``None``. Built indexes are named ``vector_idx`` and carry their query-time
parameters in a ``quarry_search`` index parameter. Milvus Lite 2.5.1 builds only ``FLAT`` and
``IVF_FLAT`` (it refuses HNSW, IVF_PQ and DiskANN); the 2.3 server builds all five kinds.
Rebuilding an index releases the collection: searches fail until the build ends (use an alias
swap for zero-downtime reindexing).

Aliases: native on the server; Milvus Lite has no alias RPCs, so aliases live in a hidden
``_quarry_meta`` collection of the same database file and are resolved in process (a Lite file
can only be opened by one process at a time, so the in-process view is the only one).

Thread safety: one :class:`MilvusStore` (one gRPC channel) may be shared by the threads of a
server; the Lite alias table and the collection-info cache are guarded by a lock.
"""

from __future__ import annotations

import json
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import numpy as np

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    ConfigError,
    DimensionMismatch,
    IndexBuildFailed,
    InvalidDocument,
    InvalidQuery,
    InvalidRequest,
    QuarryError,
    StoreError,
    StoreUnavailable,
    UnsupportedIndex,
    missing_extra,
)
from stores.base import (
    FloatMatrix,
    IndexKind,
    IndexSpec,
    Metric,
    Payload,
    ScoredId,
    StoreCapabilities,
    VectorRecord,
)
from stores.filters import Filter
from stores.milvus_expr import compile_filter, decode_id, encode_id, ids_expr

try:
    from pymilvus import DataType, MilvusClient, MilvusException
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise missing_extra("pymilvus", "milvus-server") from exc

T = TypeVar("T")
_METRICS: dict[str, str] = {"cosine": "COSINE", "ip": "IP", "l2": "L2"}
_LITE_KINDS: frozenset[IndexKind] = frozenset({"FLAT", "IVF_FLAT"})
_SERVER_KINDS: frozenset[IndexKind] = frozenset({"FLAT", "HNSW", "IVF_FLAT", "IVF_PQ", "DISKANN"})
_EXACT, _BUILT, _META = "exact", "vector_idx", "_quarry_meta"
_SEARCH_KEY = "quarry_search"
_MAX_ID_LEN = 512
_BATCH = 1000
_MAX_TOP_K = 16384
_POLL_S = 0.2


@dataclass(frozen=True)
class _Info:
    """What every call needs to know about a physical collection."""

    name: str
    dim: int
    metric: Metric


class MilvusStore:
    """:class:`~stores.base.VectorStore` on Milvus Lite or a Milvus server (via ``pymilvus``)."""

    def __init__(self, client: Any, *, lite: bool, uri: str) -> None:
        """Wrap a connected ``pymilvus.MilvusClient``; use :meth:`from_url` instead."""
        self._client = client
        self._lite = lite
        self._uri = uri
        self._lock = threading.RLock()
        self._infos: dict[str, _Info] = {}
        self._aliases: dict[str, str] = {}
        self._specs: dict[str, IndexSpec | None] = {}
        self._closed = False
        if lite:
            self._load_lite_aliases()

    @classmethod
    def from_url(cls, url: str) -> MilvusStore:
        """Open ``milvus:///abs/path.db`` (Milvus Lite) or ``milvus://host:port`` (server).

        Raises:
            ConfigError: The URL names neither a path nor a host.
            StoreUnavailable: The server cannot be reached, or another process holds the Lite file.
        """
        parts = urlsplit(url)
        if parts.scheme.lower() != "milvus":
            raise ConfigError(f"not a Milvus URL: {url!r}")
        if parts.netloc:
            uri, lite = f"http://{parts.hostname}:{parts.port or 19530}", False
        elif parts.path and parts.path != "/":
            Path(parts.path).parent.mkdir(parents=True, exist_ok=True)
            uri, lite = parts.path, True
        else:
            raise ConfigError(f"a Milvus URL needs a host or a file path: {url!r}")
        try:
            # A private connection alias: closing this store must not close another's channel.
            client = MilvusClient(uri, timeout=30, alias=f"quarry-{uuid.uuid4().hex}")
        except Exception as exc:
            hint = " (is another process using this Milvus Lite file?)" if lite else ""
            raise StoreUnavailable(f"cannot open Milvus at {uri}{hint}: {exc}") from exc
        if lite:
            _lite_acquire(uri)
        return cls(client, lite=lite, uri=uri)

    # -- collections -----------------------------------------------------------------------

    def capabilities(self) -> StoreCapabilities:
        """Index kinds: Lite 2.5.1 builds FLAT/IVF_FLAT; server 2.3 adds HNSW, IVF_PQ, DiskANN."""
        if self._lite:
            return StoreCapabilities(
                engine="milvus-lite",
                version=_lite_version(),
                index_kinds=_LITE_KINDS,
                max_dim=32768,
                notes="Milvus Lite 2.5.1 builds only FLAT and IVF_FLAT (no HNSW, IVF_PQ, DiskANN)",
            )
        version = self._call("get_server_version", lambda: str(self._client.get_server_version()))
        return StoreCapabilities(
            engine="milvus",
            version=version,
            index_kinds=_SERVER_KINDS,
            max_dim=32768,
            notes="Milvus 2.3 DiskANN builds may stall; builds are bounded by a timeout",
        )

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create an empty collection with an exact FLAT index, loaded.

        Raises:
            CollectionExists: A collection or alias with this name exists.
            InvalidRequest: ``dim`` < 1 or an unknown metric.
        """
        if dim < 1 or metric not in _METRICS:
            raise InvalidRequest(f"invalid collection spec: dim={dim}, metric={metric!r}")
        if name == _META or self.has_collection(name):
            raise CollectionExists(name)
        schema = MilvusClient.create_schema(
            auto_id=False,
            enable_dynamic_field=False,
            description=json.dumps({"quarry": 1, "metric": metric}),
        )
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=_MAX_ID_LEN)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("payload", DataType.JSON)
        index = self._index_params(_EXACT, "FLAT", metric, {})
        self._call(
            "create_collection",
            lambda: self._client.create_collection(
                name, schema=schema, index_params=index, consistency_level="Strong"
            ),
        )
        with self._lock:
            self._infos[name] = _Info(name, dim, metric)

    def drop_collection(self, name: str) -> None:
        """Drop a physical collection and the aliases pointing at it; missing is not an error."""
        if name == _META or name not in self._physical():
            return
        for alias in self._aliases_of(name):
            self.drop_alias(alias)
        self._call("drop_collection", lambda: self._client.drop_collection(name))
        with self._lock:
            self._infos.pop(name, None)
            self._specs.pop(name, None)

    def has_collection(self, name: str) -> bool:
        """Whether a collection or an alias with this name exists."""
        if name == _META:
            return False
        if name in self._physical():
            return True
        return self._alias_target(name) is not None

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted (the Lite alias table is hidden)."""
        return sorted(self._physical())

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors (``name`` may be an alias)."""
        return self._info(name).dim

    # -- records ---------------------------------------------------------------------------

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id (the last of duplicate ids in one call wins).

        Raises:
            DimensionMismatch: A vector has the wrong dimension; nothing is written.
            InvalidDocument: An id is empty or longer than 512 characters once encoded.
        """
        info = self._info(name)
        rows = _rows(records, info)
        for start in range(0, len(rows), _BATCH):
            batch = rows[start : start + _BATCH]
            self._call("upsert", partial(self._client.upsert, info.name, batch), info.name)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        info = self._info(name)
        keys = list(dict.fromkeys(encode_id(i) for i in ids))
        for start in range(0, len(keys), _BATCH):
            expr = ids_expr(keys[start : start + _BATCH])
            self._call("delete", partial(self._client.delete, info.name, filter=expr), info.name)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``."""
        info = self._info(name)
        expr = compile_filter(flt, lite=self._lite)
        self._call("delete", lambda: self._client.delete(info.name, filter=expr), info.name)

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id in the order of ``ids`` (missing ids skipped, duplicates once)."""
        info = self._info(name)
        keys = list(dict.fromkeys(encode_id(i) for i in ids))
        found: dict[str, VectorRecord] = {}
        for start in range(0, len(keys), _BATCH):
            expr = ids_expr(keys[start : start + _BATCH])
            rows = self._call(
                "query",
                partial(
                    self._client.query,
                    info.name,
                    filter=expr,
                    output_fields=["id", "vector", "payload"],
                ),
                info.name,
            )
            for row in rows:
                vector = np.asarray(row["vector"], dtype=np.float32)
                found[row["id"]] = VectorRecord(decode_id(row["id"]), vector, row["payload"] or {})
        return [found[k] for k in keys if k in found]

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt``."""
        info = self._info(name)
        expr = compile_filter(flt, lite=self._lite) if flt is not None else ""
        rows = self._call(
            "count",
            lambda: self._client.query(info.name, filter=expr, output_fields=["count(*)"]),
            info.name,
        )
        return int(rows[0]["count(*)"])

    def search(
        self,
        name: str,
        queries: FloatMatrix,
        top_k: int,
        flt: Filter | None = None,
        search_params: dict[str, Any] | None = None,
    ) -> list[list[ScoredId]]:
        """Batched k-NN search inside Milvus (filters applied by the engine).

        Args:
            name: Collection or alias.
            queries: ``(n, dim) float32`` (L2-normalised for cosine).
            top_k: Hits per query, ``1..16384``.
            flt: Optional payload filter.
            search_params: Overrides of the index's query-time parameters (``ef``, ``nprobe``,
                ``search_list``); HNSW ``ef`` is raised to at least ``top_k``.

        Returns:
            ``n`` lists of at most ``top_k`` hits, best first (see module doc for scores).

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``top_k`` out of range or ``queries`` not a 2-d matrix.
        """
        info = self._info(name)
        matrix = _query_matrix(queries, info)
        if not 1 <= top_k <= _MAX_TOP_K:
            raise InvalidQuery(f"top_k must be in 1..{_MAX_TOP_K}, got {top_k}")
        if matrix.shape[0] == 0:
            return []
        params = self._search_params(info, top_k, search_params or {})
        expr = compile_filter(flt, lite=self._lite) if flt is not None else ""
        raw = self._call(
            "search",
            lambda: self._client.search(
                info.name,
                data=matrix.tolist(),
                limit=top_k,
                filter=expr,
                output_fields=["payload"],
                search_params={"metric_type": _METRICS[info.metric], "params": params},
            ),
            info.name,
        )
        score = _l2_score if info.metric == "l2" else float
        return [
            [ScoredId(decode_id(hit["id"]), score(hit["distance"]), _payload(hit)) for hit in hits]
            for hits in raw
        ]

    # -- indexes ---------------------------------------------------------------------------

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Flush, replace the index with ``spec`` and wait until every row is indexed.

        Raises:
            UnsupportedIndex: The engine cannot build ``spec.kind``, the metric differs from the
                collection's, or Milvus rejects the parameters (raised before any waiting).
            IndexBuildFailed: The build failed or did not finish (and load) within
                ``timeout_s``; the partial index was dropped and exact search restored.
        """
        info = self._info(name)
        self._check_spec(info, spec)
        deadline = time.monotonic() + timeout_s
        self._call("flush", lambda: self._client.flush(info.name), info.name)
        self._unindex(info)
        index = self._index_params(_BUILT, spec.kind, spec.metric, spec.params, spec.search_params)
        try:
            self._client.create_index(info.name, index)
        except MilvusException as exc:
            self._restore_exact(info)
            raise UnsupportedIndex(f"Milvus refused {spec.kind} {spec.params}: {exc}") from exc
        try:
            self._wait_built(info, spec.kind, deadline)
            remaining = max(deadline - time.monotonic(), 1.0)
            self._client.load_collection(info.name, timeout=remaining)
        except Exception as exc:
            self._rollback(info)
            if isinstance(exc, IndexBuildFailed):
                raise
            raise IndexBuildFailed(
                f"{spec.kind} index on {info.name!r} did not become ready: {exc}"
            ) from exc

    def describe_index(self, name: str) -> IndexSpec | None:
        """The built index, or ``None`` when the collection only has the exact FLAT index."""
        info = self._info(name)
        names = self._call("list_indexes", lambda: self._client.list_indexes(info.name), info.name)
        if _BUILT not in names:
            return None
        raw = self._call(
            "describe_index", lambda: self._client.describe_index(info.name, _BUILT), info.name
        )
        return _spec_from(raw, info.metric)

    def drop_index(self, name: str) -> None:
        """Drop the built index; the collection falls back to exact (FLAT) search."""
        info = self._info(name)
        names = self._call("list_indexes", lambda: self._client.list_indexes(info.name), info.name)
        if _BUILT in names:
            self._rollback(info)

    # -- aliases ---------------------------------------------------------------------------

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at the physical ``collection``, creating or atomically swapping it.

        Raises:
            CollectionNotFound: ``collection`` is not a physical collection.
            CollectionExists: ``alias`` is the name of a physical collection.
        """
        physical = self._physical()
        if collection not in physical:
            raise CollectionNotFound(collection)
        if alias in physical or alias == _META:
            raise CollectionExists(alias)
        if self._lite:
            self._write_lite_alias(alias, collection)
        elif self._alias_target(alias) is None:
            self._call("create_alias", lambda: self._client.create_alias(collection, alias))
        else:
            self._call("alter_alias", lambda: self._client.alter_alias(collection, alias))

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        if self._alias_target(alias) is None:
            return
        if self._lite:
            with self._lock:
                self._call(
                    "drop_alias",
                    lambda: self._client.delete(_META, filter=ids_expr([encode_id(alias)])),
                )
                self._aliases.pop(alias, None)
        else:
            self._call("drop_alias", lambda: self._client.drop_alias(alias))

    def resolve(self, name: str) -> str:
        """The physical collection ``name`` refers to (``name`` itself if it is not an alias)."""
        return self._alias_target(name) or name

    def close(self) -> None:
        """Close the gRPC channel, and stop the embedded Lite server when this was its last user.

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
        with _wrapped(op, name):
            return fn()

    def _physical(self) -> set[str]:
        names = self._call("list_collections", lambda: self._client.list_collections())
        return {n for n in names if n != _META}

    def _info(self, name: str) -> _Info:
        # Lite: aliases and infos are cached in process (one process per file). Server: one
        # describe_collection per call (it resolves aliases), so other writers are seen.
        physical = self.resolve(name) if self._lite else name
        with self._lock:
            cached = self._infos.get(physical)
        if cached is not None and self._lite:
            return cached
        if physical == _META:
            raise CollectionNotFound(name)
        try:
            desc = self._call(
                "describe_collection", lambda: self._client.describe_collection(physical), name
            )
        except CollectionNotFound:
            raise CollectionNotFound(name) from None
        info = _info_from(desc)
        with self._lock:
            self._infos[info.name] = info
        return info

    def _alias_target(self, alias: str) -> str | None:
        if self._lite:
            with self._lock:
                return self._aliases.get(alias)
        try:
            desc = self._client.describe_alias(alias)
        except MilvusException:
            return None
        except Exception as exc:
            raise StoreUnavailable(f"Milvus describe_alias failed: {exc}") from exc
        return str(desc["collection_name"])

    def _aliases_of(self, collection: str) -> list[str]:
        if self._lite:
            with self._lock:
                return [a for a, c in self._aliases.items() if c == collection]
        res = self._call(
            "list_aliases", lambda: self._client.list_aliases(collection_name=collection)
        )
        return list(res.get("aliases", []))

    def _load_lite_aliases(self) -> None:
        if not self._call("has_collection", lambda: self._client.has_collection(_META)):
            schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=_MAX_ID_LEN)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=2)
            schema.add_field("target", DataType.VARCHAR, max_length=_MAX_ID_LEN)
            index = self._index_params(_EXACT, "FLAT", "l2", {})
            self._call(
                "create_collection",
                lambda: self._client.create_collection(
                    _META, schema=schema, index_params=index, consistency_level="Strong"
                ),
            )
        rows = self._call(
            "query",
            lambda: self._client.query(_META, filter='id != ""', output_fields=["id", "target"]),
        )
        self._aliases = {decode_id(r["id"]): str(r["target"]) for r in rows}

    def _write_lite_alias(self, alias: str, collection: str) -> None:
        row = {"id": encode_id(alias), "vector": [0.0, 0.0], "target": collection}
        with self._lock:
            self._call("set_alias", lambda: self._client.upsert(_META, [row]))
            self._aliases[alias] = collection

    def _index_params(
        self,
        index_name: str,
        kind: str,
        metric: Metric,
        params: dict[str, Any],
        search_params: dict[str, Any] | None = None,
    ) -> Any:
        index = self._client.prepare_index_params()
        extra = dict(params)
        if search_params:
            extra[_SEARCH_KEY] = json.dumps(search_params, sort_keys=True)
        index.add_index(
            field_name="vector",
            index_type=kind,
            index_name=index_name,
            metric_type=_METRICS[metric],
            params=extra,
        )
        return index

    def _check_spec(self, info: _Info, spec: IndexSpec) -> None:
        kinds = _LITE_KINDS if self._lite else _SERVER_KINDS
        if spec.kind not in kinds:
            engine = "Milvus Lite" if self._lite else "this Milvus server"
            raise UnsupportedIndex(
                f"{engine} cannot build {spec.kind}; it builds {', '.join(sorted(kinds))}"
            )
        if spec.metric != info.metric:
            raise UnsupportedIndex(
                f"index metric {spec.metric!r} differs from collection {info.name!r} "
                f"metric {info.metric!r}"
            )

    def _search_params(self, info: _Info, top_k: int, overrides: dict[str, Any]) -> dict[str, Any]:
        spec = self._index_spec(info) if not overrides else None
        params = dict(spec.search_params) if spec is not None else {}
        params.update(overrides)
        kind = spec.kind if spec is not None else None
        if "ef" in params or kind == "HNSW":
            params["ef"] = max(int(params.get("ef", 0)), top_k)
        return params

    def _index_spec(self, info: _Info) -> IndexSpec | None:
        if self._lite:
            with self._lock:
                if info.name in self._specs:
                    return self._specs[info.name]
        spec = self.describe_index(info.name)
        if self._lite:
            with self._lock:
                self._specs[info.name] = spec
        return spec

    def _unindex(self, info: _Info) -> None:
        with self._lock:
            self._specs.pop(info.name, None)
        self._call("release", lambda: self._client.release_collection(info.name), info.name)
        for index_name in self._client.list_indexes(info.name):
            self._call(
                "drop_index",
                partial(self._client.drop_index, info.name, index_name),
                info.name,
            )

    def _restore_exact(self, info: _Info) -> None:
        index = self._index_params(_EXACT, "FLAT", info.metric, {})
        self._call("create_index", lambda: self._client.create_index(info.name, index), info.name)
        self._call("load", lambda: self._client.load_collection(info.name), info.name)

    def _rollback(self, info: _Info) -> None:
        self._unindex(info)
        self._restore_exact(info)

    def _wait_built(self, info: _Info, kind: str, deadline: float) -> None:
        while True:
            raw = self._call(
                "describe_index", lambda: self._client.describe_index(info.name, _BUILT), info.name
            )
            state = str(raw.get("state", ""))
            if state == "Failed":
                reason = raw.get("index_state_fail_reason", "")
                raise IndexBuildFailed(f"{kind} build on {info.name!r} failed: {reason}")
            if state == "Finished" and int(raw.get("pending_index_rows", 0)) == 0:
                return
            if time.monotonic() >= deadline:
                raise IndexBuildFailed(
                    f"{kind} build on {info.name!r} stalled: {raw.get('indexed_rows')}/"
                    f"{raw.get('total_rows')} rows indexed, state {state!r} at the timeout"
                )
            time.sleep(_POLL_S)


@contextmanager
def _wrapped(op: str, name: str | None) -> Iterator[None]:
    """Translate pymilvus/gRPC errors into the Quarry error tree."""
    try:
        yield
    except QuarryError:
        raise
    except MilvusException as exc:
        message = str(getattr(exc, "message", exc))
        if "not found" in message.lower() and "collection" in message.lower() and name:
            raise CollectionNotFound(name) from exc
        if getattr(exc, "code", None) in (2, 16, 1, 9):  # connection/unavailable codes
            raise StoreUnavailable(f"Milvus {op} failed: {message}") from exc
        raise StoreError(f"Milvus {op} failed: {message}") from exc
    except Exception as exc:
        if _is_unavailable(exc):
            raise StoreUnavailable(f"Milvus is unreachable ({op}): {exc}") from exc
        raise StoreError(f"Milvus {op} failed: {exc}") from exc


def _is_unavailable(exc: Exception) -> bool:
    code = getattr(exc, "code", None)
    text = str(code() if callable(code) else code)
    return "UNAVAILABLE" in text or "DEADLINE_EXCEEDED" in text or "closed channel" in str(exc)


_LITE_USERS: dict[str, int] = {}
_LITE_LOCK = threading.Lock()


def _lite_acquire(path: str) -> None:
    with _LITE_LOCK:
        _LITE_USERS[path] = _LITE_USERS.get(path, 0) + 1


def _lite_release(path: str) -> None:
    """Stop the in-process Milvus Lite server of ``path`` when its last store closes."""
    with _LITE_LOCK:
        _LITE_USERS[path] = _LITE_USERS.get(path, 1) - 1
        if _LITE_USERS[path] > 0:
            return
        del _LITE_USERS[path]
    from milvus_lite.server_manager import server_manager_instance

    server_manager_instance.release_server(path)


def _lite_version() -> str:
    from importlib.metadata import version

    return version("milvus-lite")


def _info_from(desc: dict[str, Any]) -> _Info:
    dim = 0
    for fld in desc.get("fields", []):
        if fld.get("name") == "vector":
            dim = int(fld.get("params", {}).get("dim", 0))
    try:
        metric = json.loads(desc.get("description") or "{}").get("metric", "cosine")
    except json.JSONDecodeError:
        metric = "cosine"
    return _Info(str(desc["collection_name"]), dim, cast(Metric, metric))


def _rows(records: Sequence[VectorRecord], info: _Info) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        vector = np.asarray(rec.vector, dtype=np.float32).reshape(-1)
        if vector.shape[0] != info.dim:
            raise DimensionMismatch(expected=info.dim, got=vector.shape[0], collection=info.name)
        if not np.all(np.isfinite(vector)):
            raise InvalidDocument(f"record {rec.id!r} has a non-finite vector component")
        key = encode_id(rec.id)
        if not key or len(key) > _MAX_ID_LEN:
            raise InvalidDocument(f"record id must be 1..{_MAX_ID_LEN} characters: {rec.id!r}")
        rows[key] = {"id": key, "vector": vector.tolist(), "payload": dict(rec.payload)}
    return list(rows.values())


def _query_matrix(queries: FloatMatrix, info: _Info) -> FloatMatrix:
    matrix = np.asarray(queries, dtype=np.float32)
    if matrix.ndim != 2:
        raise InvalidQuery(f"queries must be a (n, dim) matrix, got shape {matrix.shape}")
    if matrix.shape[1] != info.dim:
        raise DimensionMismatch(expected=info.dim, got=matrix.shape[1], collection=info.name)
    return matrix


def _l2_score(squared: float) -> float:
    """Milvus ``L2`` returns the squared distance; the contract's score is ``-distance``."""
    return -math.sqrt(max(float(squared), 0.0))


def _payload(hit: dict[str, Any]) -> Payload:
    entity = hit.get("entity") or {}
    return cast(Payload, entity.get("payload") or {})


def _spec_from(raw: dict[str, Any], metric: Metric) -> IndexSpec:
    skip = {"index_type", "metric_type", "field_name", "index_name", "dim", _SEARCH_KEY}
    skip |= {"total_rows", "indexed_rows", "pending_index_rows", "state"}
    skip |= {"index_state_fail_reason"}
    params = {k: _number(v) for k, v in raw.items() if k not in skip}
    search = json.loads(raw[_SEARCH_KEY]) if raw.get(_SEARCH_KEY) else {}
    return IndexSpec(
        kind=cast(IndexKind, raw["index_type"]),
        metric=metric,
        params=params,
        search_params=search,
    )


def _number(value: Any) -> Any:
    if isinstance(value, str):
        for conv in (int, float):
            try:
                return conv(value)
            except ValueError:
                continue
    return value
