"""Qdrant through qdrant-client: a server (``qdrant://host:6333``) or local mode (``qdrant+local://``).

Over 500 lines by design: one module per backend implementing the whole
:class:`stores.base.VectorStore` contract for one engine.

See :mod:`stores.qdrant` for the behaviour both stores share.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quarry.errors import (
    CollectionExists,
    CollectionNotFound,
    IndexBuildFailed,
    QuarryError,
    StoreError,
    StoreUnavailable,
    missing_extra,
)
from stores import qdrant_filters as qf
from stores.base import (
    FloatMatrix,
    IndexSpec,
    Metric,
    ScoredId,
    StoreCapabilities,
    VectorRecord,
)
from stores.filters import Filter, Prefix, canonical
from stores.qdrant_common import (
    BATCH,
    KINDS,
    MAX_DIM,
    NOTES,
    check_name,
    check_queries,
    check_shape,
    check_vectors,
    package_version,
)
from stores.routing import FilterRouter

if TYPE_CHECKING:
    from qdrant_client import QdrantClient

_META_KEY = "quarry_index"


def _client_models() -> Any:
    try:
        from qdrant_client import models
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise missing_extra("qdrant_client", "qdrant") from exc
    return models


class QdrantClientStore:
    """:class:`~stores.base.VectorStore` through ``qdrant-client``: a server or local mode."""

    def __init__(
        self, client: QdrantClient, *, local: bool, version: str, router: FilterRouter | None = None
    ) -> None:
        """Wrap a connected client; use :meth:`remote` or :meth:`local`.

        ``router`` routes a server's filtered searches by the points they match
        (:func:`stores.qdrant_filters.routed_knobs`); local mode searches exactly anyway.
        Counts are kept per name as given (an alias swap is seen after the router's ``ttl_s``).
        """
        self._m = _client_models()
        self.router = router or FilterRouter()
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
            is_empty=lambda key: m.IsEmptyCondition(is_empty=m.PayloadField(key=key)),
            has_id=lambda ids: m.HasIdCondition(has_id=ids),
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
    def remote(
        cls, host: str, port: int, api_key: str | None = None, router: FilterRouter | None = None
    ) -> QdrantClientStore:
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
        return cls(client, local=False, version=version, router=router)

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
        return cls(client, local=True, version=package_version("qdrant-client"))

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
                raise StoreError(f"Qdrant {what} failed", detail=str(exc)) from exc
            except (ResponseHandlingException, ConnectionError, OSError) as exc:
                raise StoreUnavailable(f"Qdrant unreachable during {what}", detail=str(exc)) from exc
            except ValueError as exc:
                if name is not None and "not found" in str(exc):
                    raise CollectionNotFound(name) from exc
                raise StoreError(f"Qdrant {what} failed", detail=str(exc)) from exc
            except Exception as exc:
                raise StoreError(f"Qdrant {what} failed", detail=str(exc)) from exc

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

    def _filter(self, flt: Filter | None, name: str) -> Any:
        if flt is None:
            return None

        def scroll(holding: Any) -> Iterator[Any]:
            offset = None
            while True:
                found, offset = self._client.scroll(
                    name, scroll_filter=holding, limit=qf.SCROLL_PAGE, offset=offset, with_payload=True,
                    with_vectors=False,
                )
                yield from (point.payload for point in found)
                if offset is None:
                    return

        def prefix_ids(cond: Prefix) -> list[str]:
            return qf.prefix_scan(cond, self._dialect, scroll, self.router.max_scan_ids)

        return qf.compile_filter(flt, self._dialect, prefix_ids)

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
        check_shape(name, dim, metric)
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
        self.router.forget(name)

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
            check_vectors(records, dim, name)
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
        self.router.forget(name)

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        with self._call("delete", name):
            self._info(name)
            if ids:
                selector = self._m.PointIdsList(points=[qf.point_id(i) for i in ids])
                self._client.delete(name, points_selector=selector, wait=True)
        self.router.forget(name)

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``."""
        with self._call("delete", name):
            self._info(name)
            selector = self._m.FilterSelector(filter=self._filter(flt, name))
            self._client.delete(name, points_selector=selector, wait=True)
        self.router.forget(name)

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
            return int(self._client.count(name, self._filter(flt, name), exact=True).count)

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
        """Batched k-NN search (one ``query_batch_points`` call); see the Protocol.

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``queries`` is not a matrix or ``top_k < 1``.
        """
        m = self._m
        with self._call("search", name):
            dim, metric, spec, _ = self._info(name)
            arr = check_queries(queries, top_k, dim, name)
            flt = canonical(flt) if flt is not None else None
            compiled = self._filter(flt, name)
            params = None  # local mode is exact anyway and warns about search params
            if not self._local:

                def count(which: Filter | None) -> int:
                    if which is None:
                        return int(self._client.count(name, None, exact=False).count)
                    return int(self._client.count(name, compiled, exact=True).count)

                knobs = qf.routed_knobs(spec, search_params, flt, top_k, self.router, name, count)
                quantization = m.QuantizationSearchParams(**knobs.quantization) if knobs.quantization else None
                acorn = m.AcornSearchParams(enable=True) if knobs.acorn else None
                params = m.SearchParams(hnsw_ef=knobs.ef, exact=knobs.exact, quantization=quantization, acorn=acorn)
            requests = [
                m.QueryRequest(
                    query=row.tolist(),
                    filter=compiled,
                    params=params,
                    limit=top_k,
                    with_payload=True if with_payload else [qf.ID_KEY],
                )
                for row in arr
            ]
            responses = self._client.query_batch_points(name, requests) if requests else []
        return [[qf.hit(metric, p) for p in r.points] for r in responses]

    # -- indexes --------------------------------------------------------------------------

    def search_exact(
        self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None
    ) -> list[list[ScoredId]]:
        """Exact k-NN: :meth:`search` with Qdrant's ``exact=True`` (full vectors, quantization ignored)."""
        return self.search(
            name, queries, top_k, flt, {"exact": True, "ignore_quantization": True}, with_payload=False
        )

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
        check_name(alias)
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
