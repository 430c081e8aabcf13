"""Mapping between Quarry's store types and Milvus: schema, index parameters, rows, hits, errors.

Used by :mod:`stores.milvus`; no engine state lives here. Schema of every Quarry collection:
``id`` VARCHAR(512) primary key (encoded by :func:`stores.milvus_expr.encode_id`),
``vector`` FLOAT_VECTOR(dim), ``payload`` JSON; the metric is kept in the description.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from pymilvus import DataType, MilvusClient, MilvusException
from pymilvus.exceptions import (
    ConnectError,
    ConnectionNotExistException,
    ErrorCode,
    MilvusUnavailableException,
)

from quarry.errors import (
    CollectionNotFound,
    DimensionMismatch,
    InvalidDocument,
    InvalidQuery,
    QuarryError,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
)
from stores.base import FloatMatrix, IndexKind, IndexSpec, Metric, Payload, ScoredId, VectorRecord
from stores.milvus_expr import decode_id, encode_id

METRICS: dict[str, str] = {"cosine": "COSINE", "ip": "IP", "l2": "L2"}
EXACT_INDEX, BUILT_INDEX = "exact", "vector_idx"
SEARCH_KEY = "quarry_search"
MAX_ID_LEN = 512
# Every pymilvus call names a timeout, in whole seconds: pymilvus bounds its retries by time only
# for an int timeout (also each attempt's gRPC deadline); without one it retries a failing call 75
# times, which took 210 s against a stopped server before the failure became a StoreUnavailable.
RETRY_S = 3  # the query path's metadata reads (list, describe) and a search's fallback
READ_S = 10  # queries, counts, index and alias reads
WRITE_S = 60  # upserts, deletes, DDL
_STATUS_KEYS = {"total_rows", "indexed_rows", "pending_index_rows", "state", "index_state_fail_reason"}
_NAME_KEYS = {"index_type", "metric_type", "field_name", "index_name", "dim", SEARCH_KEY}


@dataclass(frozen=True)
class CollectionInfo:
    """What every call needs to know about a physical collection."""

    name: str
    dim: int
    metric: Metric


def new_schema(dim: int, metric: Metric) -> Any:
    """The Milvus schema of a Quarry collection of ``dim``-dimensional vectors."""
    schema = MilvusClient.create_schema(
        auto_id=False,
        enable_dynamic_field=False,
        description=json.dumps({"quarry": 1, "metric": metric}),
    )
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=MAX_ID_LEN)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
    schema.add_field("payload", DataType.JSON)
    return schema


def index_params(
    client: Any,
    index_name: str,
    kind: str,
    metric: Metric,
    params: dict[str, Any] | None = None,
    search_params: dict[str, Any] | None = None,
) -> Any:
    """Milvus ``IndexParams`` for the ``vector`` field; query-time params ride along as JSON."""
    index = client.prepare_index_params()
    extra = dict(params or {})
    if search_params:
        extra[SEARCH_KEY] = json.dumps(search_params, sort_keys=True)
    index.add_index(
        field_name="vector",
        index_type=kind,
        index_name=index_name,
        metric_type=METRICS[metric],
        params=extra,
    )
    return index


EXHAUSTIVE_EF_MAX = 32768  # HNSW ef and DiskANN search_list bound here (Milvus accepts up to int32)


def exhaustive_params(spec: IndexSpec, params: dict[str, Any], top_k: int, rows: int = 1000) -> dict[str, Any] | None:
    """Query-time parameters with which the index scores every row the filter lets through.

    IVF kinds probe every list (``nprobe = nlist``: exact for IVF_FLAT, exact up to the codes for
    IVF_PQ). HNSW raises ``ef`` to the rows that match (at most 32,768), so that the walk can
    hold every one of them; below 7 % of rows passing the filter, knowhere answers HNSW by
    brute force over them anyway (its ``kHnswSearchKnnBFFilterThreshold``: 0.93 of the rows
    filtered out). DiskANN raises ``search_list`` likewise.

    Args:
        spec: The built index.
        params: The search's parameters (the index's, with the call's overrides).
        top_k: Hits per query.
        rows: Rows the filter matches (the router's count).

    Returns:
        The parameters, or ``None`` for a kind without such a setting.
    """
    if spec.kind in ("IVF_FLAT", "IVF_PQ", "IVF_SQ8"):
        return {**params, "nprobe": int(spec.params.get("nlist", params.get("nprobe", 1)))}
    wide = min(max(rows, top_k), EXHAUSTIVE_EF_MAX)
    if spec.kind == "HNSW":
        return {**params, "ef": max(int(params.get("ef", 0)), wide)}
    if spec.kind == "DISKANN":
        return {**params, "search_list": max(int(params.get("search_list", 0)), wide)}
    return None


def info_from(desc: dict[str, Any]) -> CollectionInfo:
    """Read dim and metric from a ``describe_collection`` answer (metric defaults to cosine)."""
    dim = 0
    for fld in desc.get("fields", []):
        if fld.get("name") == "vector":
            dim = int(fld.get("params", {}).get("dim", 0))
    try:
        metric = json.loads(desc.get("description") or "{}").get("metric", "cosine")
    except json.JSONDecodeError:
        metric = "cosine"
    return CollectionInfo(str(desc["collection_name"]), dim, cast(Metric, metric))


def spec_from(raw: dict[str, Any], metric: Metric) -> IndexSpec:
    """An :class:`IndexSpec` from a ``describe_index`` answer (numbers parsed back)."""
    params = {k: _number(v) for k, v in raw.items() if k not in _STATUS_KEYS | _NAME_KEYS}
    search = json.loads(raw[SEARCH_KEY]) if raw.get(SEARCH_KEY) else {}
    return IndexSpec(kind=cast(IndexKind, raw["index_type"]), metric=metric, params=params, search_params=search)


def _number(value: Any) -> Any:
    if isinstance(value, str):
        for conv in (int, float):
            try:
                return conv(value)
            except ValueError:
                continue
    return value


def to_rows(records: Sequence[VectorRecord], info: CollectionInfo) -> list[dict[str, Any]]:
    """Validate every record, then build Milvus rows (the last of duplicate ids wins).

    Raises:
        DimensionMismatch: A vector has the wrong dimension.
        InvalidDocument: A non-finite vector, or an id empty or over 512 bytes encoded.
    """
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        vector = np.asarray(rec.vector, dtype=np.float32).reshape(-1)
        if vector.shape[0] != info.dim:
            raise DimensionMismatch(expected=info.dim, got=vector.shape[0], collection=info.name)
        if not np.all(np.isfinite(vector)):
            raise InvalidDocument(f"record {rec.id!r} has a non-finite vector component")
        key = encode_id(rec.id)
        size = len(key.encode("utf-8"))  # VARCHAR max_length counts UTF-8 bytes
        if not key or size > MAX_ID_LEN:
            raise InvalidDocument(
                f"record id {rec.id[:60]!r}... is {size} bytes once encoded for Milvus (UTF-8, with % ' \" \\ "
                f"escaped); at most {MAX_ID_LEN}: use a shorter document id"
            )
        rows[key] = {"id": key, "vector": vector.tolist(), "payload": dict(rec.payload)}
    return list(rows.values())


def to_record(row: dict[str, Any]) -> VectorRecord:
    """A :class:`VectorRecord` from a query row with ``id``, ``vector`` and ``payload``."""
    vector = np.asarray(row["vector"], dtype=np.float32)
    return VectorRecord(decode_id(row["id"]), vector, row["payload"] or {})


def query_matrix(queries: FloatMatrix, info: CollectionInfo) -> FloatMatrix:
    """``queries`` as a ``(n, dim) float32`` matrix.

    Raises:
        InvalidQuery: Not two-dimensional.
        DimensionMismatch: Wrong number of columns.
    """
    matrix = np.asarray(queries, dtype=np.float32)
    if matrix.ndim != 2:
        raise InvalidQuery(f"queries must be a (n, dim) matrix, got shape {matrix.shape}")
    if matrix.shape[1] != info.dim:
        raise DimensionMismatch(expected=info.dim, got=matrix.shape[1], collection=info.name)
    return matrix


def to_hits(
    raw: Sequence[Sequence[dict[str, Any]]], metric: Metric, *, with_payload: bool = True
) -> list[list[ScoredId]]:
    """Milvus search answers as hits; ``L2`` squared distances become ``-distance``.

    Without payloads, the ids and distances are read from pymilvus' per-query arrays
    (``HybridHits.ids``/``.distances``) rather than through one dict-like ``Hit`` per row.
    """
    score = _l2_score if metric == "l2" else float
    out = []
    for hits in raw:
        ids, distances = getattr(hits, "ids", None), getattr(hits, "distances", None)
        if with_payload or ids is None or distances is None:
            out.append([ScoredId(decode_id(hit["id"]), score(hit["distance"]), _payload(hit)) for hit in hits])
        else:
            out.append(hits_from_arrays(ids, distances, metric))
    return out


def hits_from_arrays(ids: Sequence[str], distances: Sequence[float], metric: Metric) -> list[ScoredId]:
    """One query's ids and Milvus distances as hits without payloads (see :func:`to_hits`)."""
    score = _l2_score if metric == "l2" else float
    return [ScoredId(decode_id(i), score(d), {}) for i, d in zip(ids, distances, strict=True)]


def _l2_score(squared: float) -> float:
    return -math.sqrt(max(float(squared), 0.0))


def _payload(hit: dict[str, Any]) -> Payload:
    entity = hit.get("entity") or {}
    return cast(Payload, entity.get("payload") or {})


@contextmanager
def wrapped(op: str, name: str | None = None) -> Iterator[None]:
    """Translate pymilvus and gRPC errors into the Quarry error tree (``raise ... from``).

    Raises:
        CollectionNotFound: Milvus reports the collection ``name`` missing.
        StoreTimeout: The call ran past its deadline (``DEADLINE_EXCEEDED``): that call's failure.
        StoreUnavailable: Connection errors, rate limits, unreachable server.
        StoreError: Any other engine failure.

    The messages are Quarry's; the engine's or the driver's text is the error's ``detail``.
    """
    try:
        yield
    except QuarryError:
        raise
    except MilvusException as exc:
        message = str(getattr(exc, "message", exc))
        missing = exc.code == ErrorCode.COLLECTION_NOT_FOUND or (
            "collection" in message.lower() and "not found" in message.lower()
        )
        if missing and name is not None:
            raise CollectionNotFound(name) from exc
        if _is_timeout(exc):
            raise StoreTimeout(f"Milvus {op} did not answer in time", detail=message) from exc
        gone = (MilvusUnavailableException, ConnectError, ConnectionNotExistException)
        if isinstance(exc, gone) or exc.code == ErrorCode.RATE_LIMIT or _is_unavailable(exc):
            raise StoreUnavailable(f"Milvus {op} failed: the server is unavailable", detail=message) from exc
        raise StoreError(f"Milvus {op} failed", detail=message) from exc
    except Exception as exc:
        if _is_timeout(exc):
            raise StoreTimeout(f"Milvus {op} did not answer in time", detail=str(exc)) from exc
        if _is_unavailable(exc):
            raise StoreUnavailable(f"Milvus is unreachable ({op})", detail=str(exc)) from exc
        raise StoreError(f"Milvus {op} failed", detail=str(exc)) from exc


def _status(exc: Exception) -> str:
    code = getattr(exc, "code", None)
    return str(code() if callable(code) else code)


def _is_timeout(exc: Exception) -> bool:
    """A call past its gRPC deadline: the server may be serving others (a slow query, not an outage)."""
    return "DEADLINE_EXCEEDED" in _status(exc) or "DEADLINE_EXCEEDED" in str(exc)


def _is_unavailable(exc: Exception) -> bool:
    return "UNAVAILABLE" in _status(exc) or "closed channel" in str(exc)
