"""Qdrant backends: the real engine in process (qdrant-edge) and qdrant-client (server, local).

======================================  ==========================================================
URL                                     store
======================================  ==========================================================
``qdrant:///abs/dir``                   :class:`QdrantEdgeStore`: Qdrant's engine in process
                                        (``qdrant-edge-py``): real HNSW, payload indexes, shards
                                        persisted on disk. The engine under test.
``qdrant://host:6333``                  :class:`QdrantClientStore` on a Qdrant server (REST;
                                        ``qdrant://:API_KEY@host:6333`` passes an API key).
``qdrant+local:///abs/dir``             :class:`QdrantClientStore` on qdrant-client's local mode:
                                        a brute-force emulation that runs the server code path.
======================================  ==========================================================

Shared conventions (:mod:`stores.qdrant_filters`): point ids are ``uuid5`` of the caller's id,
which is kept in the payload under ``_id``; filters compile to structured ``Filter`` models.
Scores: cosine similarity, dot product, and ``-distance`` for ``l2`` (Qdrant's ``Euclid``
returns the distance, smaller first).

Indexes: Qdrant builds HNSW (``M``, ``efConstruction``; search ``ef``) with optional int8 scalar
or product quantization (``params["quantization"]``: ``int8``/``pq``, ``compression``), and
searches exactly (``FLAT``: ``exact=True``). Until :meth:`build_index` runs, a collection has no
index and is searched exactly. A segment smaller than ``full_scan_threshold_kb`` (default
10,000 KiB: about 51k vectors of dim 50, 6.6k of dim 384) is scanned exactly even with an HNSW
config, and so is a filtered search whose candidate set is that small (through the payload
index); the build sets the indexing threshold to the same value, so no graph is built that
would never be walked. Pass a smaller ``full_scan_threshold_kb`` (>= 10) to walk the graph on
small collections.

Payload indexes: every filterable payload field gets one on first sight (keyword for strings,
float for numbers, bool for booleans), built with ``enable_hnsw=False``. Qdrant's default adds
payload-aware graph links for every value held by more points than the full-scan threshold;
on GloVe-100k a ``tag`` field whose one value covers 99 % of the rows halved unfiltered QPS
(4,480 -> 2,061 at ef=64) and lengthened the build by 30 %. Filtered graph searches instead
ask for ACORN (two-hop expansion, applied by Qdrant below 40 % selectivity): without links
and without ACORN a 1 % filter walked on the graph returned 1-2 hits instead of 10; with
ACORN, 10 hits at recall 0.98.

Edge specifics (qdrant-edge-py 0.9.0; checks in ``tests/stores/test_qdrant.py``):

* Layout: ``<root>/collections/<name>/shard`` (one ``EdgeShard``), ``.../meta.json`` (dim,
  metric, index spec), and ``<root>/aliases.json``: edge has no aliases, so the alias map is that
  file, replaced atomically (write, fsync, ``os.replace``). One store owns a root (each shard's
  WAL is locked; a second store gets ``StoreUnavailable``), so the in-process view is
  authoritative.
* Vectors and graph are pinned in RAM (``Memory.Pinned``; the default mmap placement gave 2.5x
  fewer QPS) unless ``params["on_disk"]``; payloads are cached.
* Edge never optimizes on its own: new points land in an appendable, exactly-searched segment
  until the next :meth:`QdrantEdgeStore.build_index`, which runs ``EdgeShard.optimize()``.
* ``optimize()`` holds the GIL for the whole build (a 51 s build froze every thread for 51 s):
  a thread cannot time it out. Builds therefore run in a child process that opens the shard
  with the new config; on failure or timeout the child is killed, the previous
  ``edge_config.json`` restored and the shard reopened (Qdrant drops unfinished
  ``temp_segments`` on load). While a build runs, that collection answers ``StoreUnavailable``.
* The binding turns a Python ``bool`` in ``MatchValue`` into ``0``/``1``, so boolean fields are
  mirrored as keywords under ``_bools`` (hidden from callers; ``_id``/``_bools`` are reserved).

Thread safety: one store may be shared by the threads of a server. Edge searches release the
GIL and its shard is thread safe, so data calls run concurrently under a shared lock, and
collection/alias/index changes take it exclusively. Local mode is serialised under a lock; the
server client is not locked (``httpx`` is thread safe).

qdrant-client local mode commits every point to SQLite (about 27 ms per point on this disk):
fine for the contract suite, not for bulk loads.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import numpy as np

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    ConfigError,
    DimensionMismatch,
    IndexBuildFailed,
    InvalidQuery,
    InvalidRequest,
    QuarryError,
    StoreError,
    StoreUnavailable,
    missing_extra,
)
from stores import qdrant_filters as qf
from stores.base import (
    FloatMatrix,
    IndexKind,
    IndexSpec,
    Metric,
    ScoredId,
    StoreCapabilities,
    VectorRecord,
    VectorStore,
)
from stores.filters import Filter

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

KINDS: frozenset[IndexKind] = frozenset({"FLAT", "HNSW"})
MAX_DIM = 65_536
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
BATCH = 1000
NOTES = (
    "HNSW (M, efConstruction, search ef) plus optional int8 scalar or product quantization "
    "(params quantization='int8'|'pq', compression='x4'..'x64'); FLAT = exact search; no IVF or "
    "DiskANN; segments under full_scan_threshold_kb (default 10000 KiB) are searched exactly"
)


def open_qdrant(url: str) -> VectorStore:
    """Open the Qdrant store a URL names (see the module table).

    Raises:
        ConfigError: The URL names neither an absolute path nor a host, or an extra is missing.
        StoreUnavailable: The server cannot be reached, or another process holds the path.
    """
    parts = urlsplit(url)
    if parts.scheme.lower() == "qdrant+local":
        if parts.netloc:
            raise ConfigError(f"{url!r}: local mode takes a path, e.g. qdrant+local:///abs/dir")
        return QdrantClientStore.local(_abs_path(parts.path, url))
    if parts.hostname:
        return QdrantClientStore.remote(parts.hostname, parts.port or 6333, parts.password)
    return QdrantEdgeStore(_abs_path(parts.path, url))


def _abs_path(path: str, url: str) -> Path:
    if not path.startswith("/"):
        raise ConfigError(f"{url!r} must name an absolute path, e.g. qdrant:///var/lib/quarry")
    return Path(path)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not NAME.match(name):
        raise InvalidRequest(f"invalid name {name!r}: use 1-128 letters, digits, '_', '-', '.'")


def _check_shape(name: str, dim: int, metric: str) -> None:
    _check_name(name)
    if not 1 <= dim <= MAX_DIM or metric not in ("cosine", "ip", "l2"):
        raise InvalidRequest(f"bad collection shape: dim={dim}, metric={metric!r}")


def _check_vectors(records: Sequence[VectorRecord], dim: int, name: str) -> None:
    for rec in records:
        shape = np.shape(rec.vector)
        if len(shape) != 1 or shape[0] != dim:
            got = shape[-1] if shape else 0
            raise DimensionMismatch(expected=dim, got=int(got), collection=name)


def _check_queries(queries: FloatMatrix, top_k: int, dim: int, name: str) -> FloatMatrix:
    arr = np.asarray(queries, dtype=np.float32)
    if arr.ndim != 2:
        raise InvalidQuery(f"queries must be an (n, dim) matrix, got shape {arr.shape}")
    if arr.shape[1] != dim:
        raise DimensionMismatch(expected=dim, got=int(arr.shape[1]), collection=name)
    if top_k < 1:
        raise InvalidQuery(f"top_k must be >= 1, got {top_k}")
    return arr


def _atomic_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "unknown"


# --------------------------------------------------------------------------------------------
# qdrant-edge: the engine in process
# --------------------------------------------------------------------------------------------


def _import_edge() -> Any:
    try:
        import qdrant_edge
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise missing_extra("qdrant_edge", "qdrant") from exc
    return qdrant_edge


def _edge_dialect(qe: Any) -> qf.Dialect:
    return qf.Dialect(
        filter=qe.Filter,
        field=qe.FieldCondition,
        match_value=qe.MatchValue,
        match_any=lambda values: qe.MatchAny(any=values),
        range=qe.RangeFloat,
        bool_mirror=True,
    )


def edge_config(qe: Any, dim: int, metric: Metric, hnsw: qf.HnswSettings | None) -> Any:
    """The ``EdgeConfig`` of a collection, with an index build's settings when given.

    Vectors, graph and quantized codes are pinned in RAM (2.5x the QPS of the default mmap
    placement on GloVe-100k), or kept on disk with ``on_disk`` (codes stay in RAM).
    """
    distance = {"cosine": qe.Distance.Cosine, "ip": qe.Distance.Dot, "l2": qe.Distance.Euclid}
    ram, disk = qe.Memory.Pinned, qe.Memory.Cold
    place = disk if hnsw is not None and hnsw.on_disk else ram
    vectors = qe.EdgeVectorParams(size=dim, distance=distance[metric], memory=place)
    if hnsw is None:
        return qe.EdgeConfig(vectors=vectors, payload_memory=qe.Memory.Cached)
    quant = None
    if hnsw.quantization == "scalar":
        quant = qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, quantile=0.99, memory=ram)
    elif hnsw.quantization == "product":
        ratio = getattr(qe.CompressionRatio, f"X{hnsw.pq_ratio}")
        quant = qe.ProductQuantizationConfig(compression=ratio, memory=ram)
    graph = qe.HnswIndexConfig(
        m=hnsw.m, ef_construct=hnsw.ef_construct, full_scan_threshold=hnsw.full_scan_kb, memory=place
    )
    return qe.EdgeConfig(
        vectors=vectors,
        hnsw_config=graph,
        quantization_config=quant,
        optimizers=qe.EdgeOptimizersConfig(indexing_threshold=hnsw.full_scan_kb),
    )


def optimize_child(shard_dir: str, job: str) -> int:
    """Entry point of the build process: open the shard with the new config and optimize it.

    Args:
        shard_dir: The shard directory (the parent has closed it).
        job: JSON ``{"dim", "metric", "hnsw": HnswSettings fields}``.

    Returns:
        The process exit status (0 on success; engine errors propagate as a traceback).
    """
    qe = _import_edge()
    raw = json.loads(job)
    config = edge_config(qe, raw["dim"], raw["metric"], qf.HnswSettings(**raw["hnsw"]))
    shard = qe.EdgeShard.load(shard_dir, config)
    try:
        shard.optimize()
        shard.flush()
    finally:
        shard.close()
    return 0


_CHILD = (
    "import sys; from stores.qdrant import optimize_child; sys.exit(optimize_child(*sys.argv[1:]))"
)


class _RWLock:
    """Many readers or one writer; a waiting writer holds back new readers. Not reentrant."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            self._cond.wait_for(lambda: not self._writer and not self._waiting)
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not self._writer and not self._readers)
            self._waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


@dataclass
class _EdgeColl:
    """One edge collection: its shape, index spec and (lazily opened) shard."""

    name: str
    dim: int
    metric: Metric
    index: IndexSpec | None
    shard: Any = None
    fields: set[str] = field(default_factory=set)
    building: bool = False


class QdrantEdgeStore:
    """:class:`~stores.base.VectorStore` on Qdrant's engine in process (``qdrant-edge-py``).

    Data calls (search, upsert, count, ...) run concurrently (the engine releases the GIL in
    searches and its shard is thread safe); collection, alias and index changes take an
    exclusive lock.
    """

    def __init__(self, root: Path) -> None:
        """Open (or create) the store directory ``root``.

        Raises:
            ConfigError: ``qdrant-edge-py`` is missing or ``root`` cannot be created.
        """
        self._qe = _import_edge()
        self._dialect = _edge_dialect(self._qe)
        qe = self._qe  # payload indexes without payload-aware graph links (module notes)
        self._schema = {
            "keyword": qe.KeywordIndexParams(enable_hnsw=False),
            "float": qe.FloatIndexParams(enable_hnsw=False),
            "bool": qe.BoolIndexParams(enable_hnsw=False),
        }
        self._root = root
        try:
            (root / "collections").mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the Qdrant store directory {root}: {exc}") from exc
        self._rw = _RWLock()
        self._open_lock = threading.Lock()
        self._colls: dict[str, _EdgeColl] = {}
        self._builds: dict[str, subprocess.Popen[bytes]] = {}
        self._closed = False
        path = root / "aliases.json"
        self._aliases: dict[str, str] = json.loads(path.read_text("utf-8")) if path.exists() else {}

    # -- plumbing -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _guard(self, what: str, exclusive: bool = False) -> Iterator[None]:
        """Take the lock (shared or exclusive) and wrap engine errors."""
        with self._rw.write() if exclusive else self._rw.read():
            if self._closed:
                raise StoreError("the Qdrant edge store is closed")
            try:
                yield
            except QuarryError:
                raise
            except Exception as exc:
                raise StoreError(f"qdrant-edge {what} failed: {exc}") from exc

    def _dir(self, name: str) -> Path:
        return self._root / "collections" / name

    def _physical(self) -> set[str]:
        return {p.parent.name for p in (self._root / "collections").glob("*/meta.json")}

    def _coll(self, name: str) -> _EdgeColl:
        """The open collection a name or alias refers to (opened on first use)."""
        target = self._aliases.get(name, name)
        with self._open_lock:
            coll = self._colls.get(target) or self._load(name, target)
            if coll.building:
                raise StoreUnavailable(f"an index build is running on {target!r}; retry later")
            if coll.shard is None:
                coll.shard = self._open_shard(target)
                coll.fields = set(coll.shard.info().payload_schema)
            return coll

    def _load(self, name: str, target: str) -> _EdgeColl:
        meta_path = self._dir(target) / "meta.json"
        if not NAME.match(target) or not meta_path.exists():
            raise CollectionNotFound(name)
        meta = json.loads(meta_path.read_text("utf-8"))
        coll = _EdgeColl(target, meta["dim"], meta["metric"], qf.spec_from_json(meta["index"]))
        self._colls[target] = coll
        return coll

    def _open_shard(self, name: str) -> Any:
        try:
            return self._qe.EdgeShard.load(str(self._dir(name) / "shard"))
        except Exception as exc:
            raise StoreUnavailable(
                f"cannot open the Qdrant edge shard of {name!r} (is another process or store "
                f"using {self._root}?): {exc}"
            ) from exc

    def _save_meta(self, coll: _EdgeColl) -> None:
        index = qf.spec_to_json(coll.index) if coll.index else None
        meta = {"dim": coll.dim, "metric": coll.metric, "index": index}
        _atomic_json(self._dir(coll.name) / "meta.json", meta)

    def _set_aliases(self, aliases: dict[str, str]) -> None:
        _atomic_json(self._root / "aliases.json", aliases)
        self._aliases = aliases

    def _filter(self, flt: Filter | None) -> Any:
        return None if flt is None else qf.compile_filter(flt, self._dialect)

    # -- collections ----------------------------------------------------------------------

    def capabilities(self) -> StoreCapabilities:
        """What qdrant-edge builds: HNSW (+ quantization) and exact search."""
        version = _version("qdrant-edge-py")
        return StoreCapabilities("qdrant-edge", version, KINDS, MAX_DIM, True, NOTES)

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create an empty collection (an edge shard) of ``dim``-dimensional vectors.

        Raises:
            CollectionExists: A collection or alias with this name exists.
            InvalidRequest: Bad name, ``dim`` or metric.
        """
        _check_shape(name, dim, metric)
        with self._guard("create", exclusive=True):
            if name in self._aliases or name in self._physical():
                raise CollectionExists(name)
            path = self._dir(name)
            shutil.rmtree(path, ignore_errors=True)  # leftovers of an interrupted drop
            path.mkdir(parents=True)
            config = edge_config(self._qe, dim, metric, None)
            coll = _EdgeColl(
                name, dim, metric, None, self._qe.EdgeShard.create(str(path / "shard"), config)
            )
            self._save_meta(coll)
            self._colls[name] = coll

    def drop_collection(self, name: str) -> None:
        """Drop a physical collection, its data and the aliases pointing at it."""
        with self._guard("drop", exclusive=True):
            if name not in self._physical():
                return
            if name in self._builds:
                self._builds[name].kill()
            coll = self._colls.pop(name, None)
            if coll is not None and coll.shard is not None:
                coll.shard.close()
            self._set_aliases({a: t for a, t in self._aliases.items() if t != name})
            (self._dir(name) / "meta.json").unlink()
            shutil.rmtree(self._dir(name), ignore_errors=True)

    def has_collection(self, name: str) -> bool:
        """Whether a collection or an alias with this name exists."""
        with self._guard("list"):
            return name in self._aliases or name in self._physical()

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted."""
        with self._guard("list"):
            return sorted(self._physical())

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors."""
        with self._guard("describe"):
            return self._coll(name).dim

    # -- records --------------------------------------------------------------------------

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id (payload indexes are created for new fields).

        Raises:
            DimensionMismatch: A vector has the wrong dimension; nothing is written.
            InvalidRequest: A payload uses a reserved key (``_id``, ``_bools``).
        """
        qe = self._qe
        with self._guard("upsert"):
            coll = self._coll(name)
            _check_vectors(records, coll.dim, coll.name)
            payloads = [qf.encode_payload(r.id, r.payload, True) for r in records]
            for key, kind in qf.new_index_fields(payloads, coll.fields, True).items():
                coll.shard.update(qe.UpdateOperation.create_field_index(key, self._schema[kind]))
                coll.fields.add(key)
            points = [
                qe.Point(qf.point_id(r.id), np.asarray(r.vector, np.float32).tolist(), p)
                for r, p in zip(records, payloads, strict=True)
            ]
            for start in range(0, len(points), BATCH):
                coll.shard.update(qe.UpdateOperation.upsert_points(points[start : start + BATCH]))

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        with self._guard("delete"):
            coll = self._coll(name)
            if ids:
                op = self._qe.UpdateOperation.delete_points([qf.point_id(i) for i in ids])
                coll.shard.update(op)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``."""
        with self._guard("delete"):
            coll = self._coll(name)
            coll.shard.update(self._qe.UpdateOperation.delete_points_by_filter(self._filter(flt)))

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id (missing ids are skipped), in the order of ``ids``."""
        with self._guard("retrieve"):
            point_ids = [qf.point_id(i) for i in ids]
            found = self._coll(name).shard.retrieve(point_ids, with_payload=True, with_vector=True)
        return qf.records_in_order(found, ids)

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt`` (exact)."""
        with self._guard("count"):
            request = self._qe.CountRequest(exact=True, filter=self._filter(flt))
            return int(self._coll(name).shard.count(request))

    def search(
        self,
        name: str,
        queries: FloatMatrix,
        top_k: int,
        flt: Filter | None = None,
        search_params: dict[str, Any] | None = None,
    ) -> list[list[ScoredId]]:
        """Batched k-NN search (one planned ``query_batch``); see the Protocol.

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``queries`` is not a matrix or ``top_k < 1``.
        """
        qe = self._qe
        with self._guard("search"):
            coll = self._coll(name)
            arr = _check_queries(queries, top_k, coll.dim, coll.name)
            ef, exact, quant = qf.search_knobs(coll.index, search_params)
            quantization = qe.QuantizationSearchParams(**quant) if quant else None
            acorn = qe.AcornSearchParams(enable=True) if flt is not None else None
            params = qe.SearchParams(hnsw_ef=ef, exact=exact, quantization=quantization, acorn=acorn)
            compiled = self._filter(flt)
            requests = [
                qe.QueryRequest(
                    limit=top_k,
                    query=qe.Query.Nearest(row.tolist()),
                    filter=compiled,
                    params=params,
                    with_payload=True,
                )
                for row in arr
            ]
            batches = coll.shard.query_batch(qe.QueryBatchRequest(requests)) if requests else []
        return [[qf.hit(coll.metric, p) for p in hits] for hits in batches]

    # -- indexes --------------------------------------------------------------------------

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Build HNSW (``optimize()`` in a child process) or switch to exact search (FLAT).

        Raises:
            UnsupportedIndex: Not HNSW/FLAT, or parameters Qdrant cannot honour (fast).
            IndexBuildFailed: The build failed or outlived ``timeout_s``; the child was killed,
                the previous engine config restored and the previous index kept.
        """
        with self._guard("build", exclusive=True):
            coll = self._coll(name)
            hnsw = qf.hnsw_settings(spec, coll.dim)
            spec = IndexSpec(spec.kind, coll.metric, dict(spec.params), dict(spec.search_params))
            if spec.kind == "FLAT":
                coll.index = spec
                self._save_meta(coll)
                return
            coll.shard.flush()
            coll.shard.close()
            coll.shard, coll.building = None, True
            config_file = self._dir(coll.name) / "shard" / "edge_config.json"
            saved = config_file.read_bytes()
        job = json.dumps({"dim": coll.dim, "metric": coll.metric, "hnsw": vars(hnsw)})
        error = self._run_build(coll.name, config_file.parent, job, timeout_s)
        with self._rw.write():
            coll.building = False
            if error is None and not self._closed:
                coll.index = spec
                self._save_meta(coll)
            elif config_file.parent.exists():
                config_file.write_bytes(saved)
        if error is not None or self._closed:
            why = error or "was interrupted (store closed)"
            raise IndexBuildFailed(f"HNSW build on {coll.name!r} {why}; previous index kept")

    def _run_build(self, name: str, shard_dir: Path, job: str, timeout_s: float) -> str | None:
        """Run the optimizer child; return why it failed, or ``None`` when it succeeded."""
        package_root = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-c", _CHILD, str(shard_dir), job]
        env = {**os.environ, "PYTHONPATH": path}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._builds[name] = proc
        try:
            _, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return f"did not finish within {timeout_s:g} s (optimizer killed)"
        finally:
            self._builds.pop(name, None)
        if proc.returncode != 0:
            tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or ["killed"]
            return f"failed (exit {proc.returncode}): {tail[0]}"
        return None

    def describe_index(self, name: str) -> IndexSpec | None:
        """The index last built (``None``: exact search)."""
        with self._guard("describe"):
            return self._coll(name).index

    def drop_index(self, name: str) -> None:
        """Search exactly from now on (a built graph cannot be removed; it is not walked)."""
        with self._guard("drop_index", exclusive=True):
            coll = self._coll(name)
            coll.index = None
            self._save_meta(coll)

    # -- aliases --------------------------------------------------------------------------

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection`` (one atomic replace of ``aliases.json``).

        Raises:
            CollectionExists: ``alias`` names a physical collection.
            CollectionNotFound: ``collection`` does not exist.
        """
        _check_name(alias)
        with self._guard("alias", exclusive=True):
            physical = self._physical()
            target = self._aliases.get(collection, collection)
            if target not in physical:
                raise CollectionNotFound(collection)
            if alias in physical:
                raise CollectionExists(alias)
            self._set_aliases({**self._aliases, alias: target})

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        with self._guard("alias", exclusive=True):
            if alias in self._aliases:
                self._set_aliases({a: t for a, t in self._aliases.items() if a != alias})

    def resolve(self, name: str) -> str:
        """The physical collection a name refers to (the name itself if it is not an alias)."""
        return self._aliases.get(name, name)

    def close(self) -> None:
        """Stop running builds, flush and close every shard."""
        with self._rw.write():
            if self._closed:
                return
            self._closed = True
            for proc in list(self._builds.values()):
                proc.kill()
            for coll in self._colls.values():
                if coll.shard is not None:
                    coll.shard.flush()
                    coll.shard.close()
                    coll.shard = None


# --------------------------------------------------------------------------------------------
# qdrant-client: a server, or the local-mode emulation
# --------------------------------------------------------------------------------------------

_META_KEY = "quarry_index"


def _client_models() -> Any:
    try:
        from qdrant_client import models
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise missing_extra("qdrant_client", "qdrant") from exc
    return models


class QdrantClientStore:
    """:class:`~stores.base.VectorStore` through ``qdrant-client``: a server or local mode."""

    def __init__(self, client: QdrantClient, *, local: bool, version: str) -> None:
        """Wrap a connected client; use :meth:`remote` or :meth:`local`."""
        self._m = _client_models()
        self._client = client
        self._local = local
        self._version = version
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if local else contextlib.nullcontext()
        )
        m = self._m
        self._dialect = qf.Dialect(
            filter=m.Filter,
            field=m.FieldCondition,
            match_value=lambda v: m.MatchValue(value=v),
            match_any=lambda values: m.MatchAny(any=values),
            range=m.Range,
        )
        self._distance: dict[Metric, Any] = {
            "cosine": m.Distance.COSINE,
            "ip": m.Distance.DOT,
            "l2": m.Distance.EUCLID,
        }
        self._schema: dict[str, Any] = {  # no payload-aware graph links (module notes)
            "keyword": m.KeywordIndexParams(type=m.KeywordIndexType.KEYWORD, enable_hnsw=False),
            "float": m.FloatIndexParams(type=m.FloatIndexType.FLOAT, enable_hnsw=False),
            "bool": m.BoolIndexParams(type=m.BoolIndexType.BOOL, enable_hnsw=False),
        }

    @classmethod
    def remote(cls, host: str, port: int, api_key: str | None = None) -> QdrantClientStore:
        """Connect to a Qdrant server over REST.

        Raises:
            StoreUnavailable: The server does not answer.
        """
        _client_models()
        from qdrant_client import QdrantClient

        client = QdrantClient(
            host=host, port=port, api_key=api_key, timeout=30, check_compatibility=False
        )
        try:
            version = client.info().version
        except Exception as exc:
            raise StoreUnavailable(f"no Qdrant server at {host}:{port}: {exc}") from exc
        return cls(client, local=False, version=version)

    @classmethod
    def local(cls, path: Path) -> QdrantClientStore:
        """Open qdrant-client's local mode (brute force emulation) persisted at ``path``.

        Raises:
            StoreUnavailable: Another process holds ``path``.
        """
        _client_models()
        from qdrant_client import QdrantClient

        try:
            client = QdrantClient(path=str(path))
        except Exception as exc:
            raise StoreUnavailable(f"cannot open Qdrant local storage {path}: {exc}") from exc
        return cls(client, local=True, version=_version("qdrant-client"))

    @contextlib.contextmanager
    def _call(self, what: str, name: str | None = None) -> Iterator[None]:
        """Serialise (local mode) and translate client errors."""
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        with self._lock:
            try:
                yield
            except QuarryError:
                raise
            except UnexpectedResponse as exc:
                if exc.status_code == 404 and name is not None:
                    raise CollectionNotFound(name) from exc
                raise StoreError(f"Qdrant {what} failed: {exc}") from exc
            except (ResponseHandlingException, ConnectionError, OSError) as exc:
                raise StoreUnavailable(f"Qdrant unreachable during {what}: {exc}") from exc
            except ValueError as exc:
                if name is not None and "not found" in str(exc):
                    raise CollectionNotFound(name) from exc
                raise StoreError(f"Qdrant {what} failed: {exc}") from exc
            except Exception as exc:
                raise StoreError(f"Qdrant {what} failed: {exc}") from exc

    def _aliases(self) -> dict[str, str]:
        found = self._client.get_aliases().aliases
        return {a.alias_name: a.collection_name for a in found}

    def _physical(self) -> set[str]:
        return {c.name for c in self._client.get_collections().collections}

    def _info(self, name: str) -> tuple[int, Metric, IndexSpec | None, set[str]]:
        """``(dim, metric, index spec, indexed payload fields)`` of a collection or alias.

        One ``get_collection`` call (Qdrant resolves aliases itself; point operations below also
        take the alias name, so a swap between two calls is harmless).
        """
        info = self._client.get_collection(name)
        vectors = info.config.params.vectors
        if not isinstance(vectors, self._m.VectorParams):
            raise StoreError(f"collection {name!r} has named vectors; Quarry uses one vector")
        metric: Metric = next(k for k, v in self._distance.items() if v == vectors.distance)
        spec = qf.spec_from_json((info.config.metadata or {}).get(_META_KEY))
        return int(vectors.size), metric, spec, set(info.payload_schema or {})

    def _target(self, name: str) -> str:
        """The physical collection behind a name (for collection-level updates)."""
        target = self._aliases().get(name, name)
        if target not in self._physical():
            raise CollectionNotFound(name)
        return target

    def _filter(self, flt: Filter | None) -> Any:
        return None if flt is None else qf.compile_filter(flt, self._dialect)

    # -- collections ----------------------------------------------------------------------

    def capabilities(self) -> StoreCapabilities:
        """HNSW (+ quantization) and exact search; local mode only emulates them."""
        engine = "qdrant-local" if self._local else "qdrant"
        notes = NOTES + ("; local mode is a brute-force emulation" if self._local else "")
        return StoreCapabilities(engine, self._version, KINDS, MAX_DIM, True, notes)

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create an empty collection; indexing stays off until :meth:`build_index`.

        Raises:
            CollectionExists: A collection or alias with this name exists.
        """
        _check_shape(name, dim, metric)
        m = self._m
        with self._call("create", name):
            if name in self._physical() or name in self._aliases():
                raise CollectionExists(name)
            self._client.create_collection(
                name,
                vectors_config=m.VectorParams(size=dim, distance=self._distance[metric]),
                optimizers_config=m.OptimizersConfigDiff(indexing_threshold=0),
                metadata={_META_KEY: None},
            )

    def drop_collection(self, name: str) -> None:
        """Drop a physical collection, its data and the aliases pointing at it."""
        m = self._m
        with self._call("drop", name):
            if name not in self._physical():
                return
            ops = [
                m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=a))
                for a, t in self._aliases().items()
                if t == name
            ]
            if ops:
                self._client.update_collection_aliases(ops)
            self._client.delete_collection(name)

    def has_collection(self, name: str) -> bool:
        """Whether a collection or an alias with this name exists."""
        with self._call("list"):
            return name in self._physical() or name in self._aliases()

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted."""
        with self._call("list"):
            return sorted(self._physical())

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors."""
        with self._call("describe", name):
            return self._info(name)[0]

    # -- records --------------------------------------------------------------------------

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id (``wait=True``).

        Raises:
            DimensionMismatch: A vector has the wrong dimension; nothing is written.
            InvalidRequest: A payload uses a reserved key (``_id``).
        """
        m = self._m
        with self._call("upsert", name):
            dim, _, _, fields = self._info(name)
            _check_vectors(records, dim, name)
            payloads = [qf.encode_payload(r.id, r.payload, False) for r in records]
            if not self._local:  # local mode ignores payload indexes (and warns)
                for key, kind in qf.new_index_fields(payloads, fields, False).items():
                    self._client.create_payload_index(name, key, self._schema[kind], wait=True)
            points = [
                m.PointStruct(
                    id=qf.point_id(r.id),
                    vector=np.asarray(r.vector, np.float32).tolist(),
                    payload=p,
                )
                for r, p in zip(records, payloads, strict=True)
            ]
            for start in range(0, len(points), BATCH):
                self._client.upsert(name, points[start : start + BATCH], wait=True)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        with self._call("delete", name):
            self._info(name)
            if ids:
                selector = self._m.PointIdsList(points=[qf.point_id(i) for i in ids])
                self._client.delete(name, points_selector=selector, wait=True)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``."""
        with self._call("delete", name):
            self._info(name)
            selector = self._m.FilterSelector(filter=self._filter(flt))
            self._client.delete(name, points_selector=selector, wait=True)

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id (missing ids are skipped), in the order of ``ids``."""
        with self._call("retrieve", name):
            self._info(name)
            found = self._client.retrieve(
                name, [qf.point_id(i) for i in ids], with_payload=True, with_vectors=True
            )
        return qf.records_in_order(found, ids)

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt`` (exact)."""
        with self._call("count", name):
            self._info(name)
            return int(self._client.count(name, self._filter(flt), exact=True).count)

    def search(
        self,
        name: str,
        queries: FloatMatrix,
        top_k: int,
        flt: Filter | None = None,
        search_params: dict[str, Any] | None = None,
    ) -> list[list[ScoredId]]:
        """Batched k-NN search (one ``query_batch_points`` call); see the Protocol.

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``queries`` is not a matrix or ``top_k < 1``.
        """
        m = self._m
        with self._call("search", name):
            dim, metric, spec, _ = self._info(name)
            arr = _check_queries(queries, top_k, dim, name)
            ef, exact, quant = qf.search_knobs(spec, search_params)
            quantization = m.QuantizationSearchParams(**quant) if quant else None
            acorn = m.AcornSearchParams(enable=True) if flt is not None else None
            params = m.SearchParams(hnsw_ef=ef, exact=exact, quantization=quantization, acorn=acorn)
            if self._local:  # local mode is exact anyway and warns about search params
                params = None
            compiled = self._filter(flt)
            requests = [
                m.QueryRequest(
                    query=row.tolist(),
                    filter=compiled,
                    params=params,
                    limit=top_k,
                    with_payload=True,
                )
                for row in arr
            ]
            responses = self._client.query_batch_points(name, requests) if requests else []
        return [[qf.hit(metric, p) for p in r.points] for r in responses]

    # -- indexes --------------------------------------------------------------------------

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Update the HNSW/quantization config and wait until the optimizer is done.

        Raises:
            UnsupportedIndex: Not HNSW/FLAT, or parameters Qdrant cannot honour (fast).
            IndexBuildFailed: The collection was not green within ``timeout_s``; the previous
                index config was restored.
        """
        deadline = time.monotonic() + timeout_s
        with self._call("build", name):
            dim, metric, previous, _ = self._info(name)
            target = self._target(name)
            hnsw = qf.hnsw_settings(spec, dim)
            spec = IndexSpec(spec.kind, metric, dict(spec.params), dict(spec.search_params))
            if spec.kind == "HNSW":
                self._apply(target, hnsw)
                if not self._wait_green(target, deadline):
                    built = previous if previous and previous.kind == "HNSW" else None
                    self._apply(target, qf.hnsw_settings(built, dim) if built else None)
                    raise IndexBuildFailed(
                        f"HNSW build on {target!r} did not finish within {timeout_s:g} s; "
                        "previous index config restored"
                    )
            self._client.update_collection(target, metadata={_META_KEY: qf.spec_to_json(spec)})

    def _apply(self, target: str, hnsw: qf.HnswSettings | None) -> None:
        m = self._m
        if hnsw is None:
            self._client.update_collection(
                target, optimizers_config=m.OptimizersConfigDiff(indexing_threshold=0)
            )
            return
        quant: Any = m.Disabled.DISABLED
        if hnsw.quantization == "scalar":
            quant = m.ScalarQuantization(
                scalar=m.ScalarQuantizationConfig(
                    type=m.ScalarType.INT8, quantile=0.99, always_ram=True
                )
            )
        elif hnsw.quantization == "product":
            ratio = m.CompressionRatio(f"x{hnsw.pq_ratio}")
            quant = m.ProductQuantization(
                product=m.ProductQuantizationConfig(compression=ratio, always_ram=True)
            )
        self._client.update_collection(
            target,
            hnsw_config=m.HnswConfigDiff(
                m=hnsw.m,
                ef_construct=hnsw.ef_construct,
                full_scan_threshold=hnsw.full_scan_kb,
                on_disk=hnsw.on_disk,
            ),
            optimizers_config=m.OptimizersConfigDiff(indexing_threshold=hnsw.full_scan_kb),
            quantization_config=quant,
            vectors_config={"": m.VectorParamsDiff(on_disk=hnsw.on_disk)},
        )

    def _wait_green(self, target: str, deadline: float) -> bool:
        """Poll until the optimizer is done (status green); False at the deadline."""
        while True:
            info = self._client.get_collection(target)
            if info.status == self._m.CollectionStatus.GREEN:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def describe_index(self, name: str) -> IndexSpec | None:
        """The index last built (``None``: exact search)."""
        with self._call("describe", name):
            return self._info(name)[2]

    def drop_index(self, name: str) -> None:
        """Search exactly from now on and stop building graphs for new segments."""
        with self._call("drop_index", name):
            target = self._target(name)
            self._apply(target, None)
            self._client.update_collection(target, metadata={_META_KEY: None})

    # -- aliases --------------------------------------------------------------------------

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection`` (delete + create in one atomic alias update).

        Raises:
            CollectionExists: ``alias`` names a physical collection.
            CollectionNotFound: ``collection`` does not exist.
        """
        _check_name(alias)
        m = self._m
        with self._call("alias", collection):
            aliases, physical = self._aliases(), self._physical()
            target = aliases.get(collection, collection)
            if target not in physical:
                raise CollectionNotFound(collection)
            if alias in physical:
                raise CollectionExists(alias)
            ops: list[Any] = []
            if alias in aliases:
                ops.append(m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=alias)))
            create = m.CreateAlias(collection_name=target, alias_name=alias)
            ops.append(m.CreateAliasOperation(create_alias=create))
            self._client.update_collection_aliases(ops)

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        m = self._m
        with self._call("alias"):
            if alias in self._aliases():
                op = m.DeleteAliasOperation(delete_alias=m.DeleteAlias(alias_name=alias))
                self._client.update_collection_aliases([op])

    def resolve(self, name: str) -> str:
        """The physical collection a name refers to (the name itself if it is not an alias)."""
        with self._call("alias"):
            return self._aliases().get(name, name)

    def close(self) -> None:
        """Close the client (and release the local-mode storage lock)."""
        with self._call("close"):
            self._client.close()
