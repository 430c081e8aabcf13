"""The ``VectorStore`` seam: one narrow contract every engine implements.

Backends live one per module (``stores/milvus.py``, ``stores/qdrant.py``, ``stores/pgvector.py``)
and are chosen by URL scheme in :func:`stores.factory.open_store`. The contract test suite in
``tests/stores/test_contract.py`` runs unchanged against every backend.

Conventions shared by all backends:

* ids are strings (chunk ids); a backend that needs integer/UUID keys maps them internally
  and always returns the caller's string id.
* vectors are ``(n, dim) float32``; for ``metric="cosine"`` callers pass L2-normalised vectors.
* scores are "higher is better": cosine similarity, inner product, or ``-distance`` for ``l2``.
* payloads are flat ``{str: str | int | float | bool | list[str]}`` dicts; filters apply to them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from stores.filters import Filter

Metric = Literal["cosine", "ip", "l2"]
IndexKind = Literal["FLAT", "HNSW", "IVF_FLAT", "IVF_PQ", "DISKANN"]
PayloadValue = str | int | float | bool | list[str]
Payload = dict[str, PayloadValue]
FloatMatrix = npt.NDArray[np.float32]


@dataclass(frozen=True)
class VectorRecord:
    """One stored vector.

    Attributes:
        id: Caller's string id (a chunk id).
        vector: ``(dim,) float32``.
        payload: Flat metadata used for filtering and returned with hits.
    """

    id: str
    vector: npt.NDArray[np.float32]
    payload: Payload = field(default_factory=dict)


class ScoredId(NamedTuple):
    """One search result: the record id, its score (higher is better) and its payload.

    A named tuple: a top-200 search builds 200 of them per query, at half a dataclass's cost.
    """

    id: str
    score: float
    payload: Payload


@dataclass(frozen=True)
class IndexSpec:
    """An index to build, with explicit parameters in the field's standard terms.

    Attributes:
        kind: ``FLAT`` (exact), ``HNSW``, ``IVF_FLAT``, ``IVF_PQ`` or ``DISKANN``.
        metric: Distance the index is built for.
        params: Build parameters: HNSW ``M``, ``efConstruction``; IVF ``nlist``; PQ ``m``,
            ``nbits``; backend extras such as ``quantization`` or ``halfvec``.
        search_params: Query-time parameters: HNSW ``ef``; IVF ``nprobe``; DiskANN
            ``search_list``.
    """

    kind: IndexKind
    metric: Metric = "cosine"
    params: dict[str, Any] = field(default_factory=dict)
    search_params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StoreCapabilities:
    """What an engine can build, so the index planner can pick what is available.

    Attributes:
        engine: Engine name, e.g. ``"milvus-lite"``, ``"milvus"``, ``"qdrant-edge"``, ``"pgvector"``.
        version: Engine version string.
        index_kinds: Index kinds this engine (at this version) can build.
        max_dim: Largest dimension an index can be built on (``None`` = no limit known).
        persistent: Whether data survives a process restart.
        notes: Free-text notes (e.g. "no IVF_PQ in Milvus Lite").
    """

    engine: str
    version: str
    index_kinds: frozenset[IndexKind]
    max_dim: int | None = None
    persistent: bool = True
    notes: str = ""


@runtime_checkable
class VectorStore(Protocol):
    """Contract of a vector store backend.

    Every method raises ``CollectionNotFound`` for an unknown collection name (aliases resolve
    to their target everywhere a collection name is accepted), ``StoreUnavailable`` when the
    engine cannot be reached, and ``StoreError`` for other engine failures.
    """

    def capabilities(self) -> StoreCapabilities:
        """Return what this engine can build (used by the index planner)."""
        ...

    def create_collection(self, name: str, dim: int, metric: Metric = "cosine") -> None:
        """Create an empty collection of ``dim``-dimensional vectors.

        Raises:
            CollectionExists: A collection or alias with this name exists.
        """
        ...

    def drop_collection(self, name: str) -> None:
        """Drop a collection and its data; a missing collection is not an error."""
        ...

    def has_collection(self, name: str) -> bool:
        """Whether a collection (or an alias) with this name exists."""
        ...

    def list_collections(self) -> list[str]:
        """Names of the physical collections, sorted."""
        ...

    def collection_dim(self, name: str) -> int:
        """Dimension of the collection's vectors."""
        ...

    def upsert(self, name: str, records: Sequence[VectorRecord]) -> None:
        """Insert or replace records by id; re-running the same call changes nothing.

        Raises:
            DimensionMismatch: Any record's vector has the wrong dimension; nothing is written.
        """
        ...

    def delete(self, name: str, ids: Sequence[str]) -> None:
        """Delete records by id; unknown ids are ignored."""
        ...

    def delete_by_filter(self, name: str, flt: Filter) -> None:
        """Delete every record whose payload matches ``flt``."""
        ...

    def get(self, name: str, ids: Sequence[str]) -> list[VectorRecord]:
        """Fetch records by id (missing ids are skipped), in the order of ``ids``."""
        ...

    def count(self, name: str, flt: Filter | None = None) -> int:
        """Number of records, optionally only those matching ``flt``."""
        ...

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
        """Batched k-nearest-neighbour search.

        Args:
            name: Collection or alias.
            queries: ``(n, dim) float32`` query vectors (L2-normalised for cosine).
            top_k: Hits per query, ``>= 1``. Fewer come back only when fewer records match.
            flt: Optional payload filter, applied inside the engine (not post-filtered).
            search_params: Overrides for the index's query-time parameters (``ef``, ``nprobe``).
            with_payload: ``False`` leaves every hit's payload empty, so that the engine neither
                reads nor sends it (Qdrant's ``with_payload``, Milvus's ``output_fields``): ids and
                scores are the same either way.

        Returns:
            ``n`` lists of at most ``top_k`` hits each, best first.

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
        """
        ...

    def search_exact(
        self, name: str, queries: FloatMatrix, top_k: int, flt: Filter | None = None
    ) -> list[list[ScoredId]]:
        """Exact k-nearest-neighbour search: every stored row (that ``flt`` matches) is scored.

        The ground truth the recall monitor (:mod:`monitoring`) compares the ANN answer with,
        whatever index the collection has; slow by design (a scan), payloads are left empty.
        Each backend says in its module docstring which exact method it uses.

        Args:
            name: Collection or alias.
            queries: ``(n, dim) float32`` query vectors (L2-normalised for cosine).
            top_k: Hits per query, ``>= 1``.
            flt: Optional payload filter.

        Returns:
            ``n`` lists of at most ``top_k`` hits each, best first, scored as :meth:`search` does.

        Raises:
            DimensionMismatch: ``queries.shape[1]`` differs from the collection's dimension.
            InvalidQuery: ``top_k < 1`` or ``queries`` not a matrix.
        """
        ...

    def build_index(self, name: str, spec: IndexSpec, timeout_s: float = 600.0) -> None:
        """Build (or replace) the vector index, waiting until it is ready.

        Raises:
            UnsupportedIndex: The engine cannot build ``spec.kind`` or its parameters (fast).
            IndexBuildFailed: The build failed or did not finish within ``timeout_s``; the partial
                index was dropped.
        """
        ...

    def describe_index(self, name: str) -> IndexSpec | None:
        """The index the collection has, or ``None`` when it has none (exact search)."""
        ...

    def drop_index(self, name: str) -> None:
        """Drop the vector index (search falls back to exact where the engine allows)."""
        ...

    def set_alias(self, alias: str, collection: str) -> None:
        """Point ``alias`` at ``collection``, creating it or atomically swapping its target."""
        ...

    def drop_alias(self, alias: str) -> None:
        """Remove an alias; a missing alias is not an error."""
        ...

    def resolve(self, name: str) -> str:
        """The physical collection a name refers to (the name itself if it is not an alias)."""
        ...

    def close(self) -> None:
        """Release connections and handles; the store is unusable afterwards."""
        ...


def exact_top_k(
    queries: FloatMatrix, vectors: FloatMatrix, ids: Sequence[str], top_k: int, metric: Metric
) -> list[list[ScoredId]]:
    """Exact k-NN in numpy: a backend's scan of its stored vectors (see ``search_exact``).

    Args:
        queries: ``(n, dim) float32``.
        vectors: ``(m, dim) float32``, the stored vectors; ``ids[i]`` is the id of row ``i``.
        ids: ``m`` ids.
        top_k: Hits per query.
        metric: ``cosine``/``ip`` score by inner product, ``l2`` by ``-`` Euclidean distance.

    Returns:
        ``n`` lists of at most ``top_k`` hits, best first, without payloads.
    """
    if len(ids) == 0:
        return [[] for _ in range(len(queries))]
    if metric == "l2":
        squared = (queries**2).sum(1)[:, None] - 2 * queries @ vectors.T + (vectors**2).sum(1)[None, :]
        scores = -np.sqrt(np.maximum(squared, 0.0))
    else:
        scores = queries @ vectors.T
    k = min(top_k, len(ids))
    out = []
    for row in scores:
        top = np.argpartition(-row, k - 1)[:k]
        top = top[np.argsort(-row[top], kind="stable")]
        out.append([ScoredId(ids[i], float(row[i]), {}) for i in top.tolist()])
    return out


def redact_url(url: str) -> str:
    """``url`` with its password (PostgreSQL's, or Qdrant's API key) shown as ``***``, for messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))
