"""Ids and scores of a Milvus search read straight from its protobuf answer (pymilvus internals).

``MilvusClient.search`` wraps every row of an answer in a dict-like ``Hit`` (pymilvus 2.5's
``HybridHits``). For the query path's 200-row dense channel that took 0.43 of the 0.85 ms of
client CPU per search, all of it under the GIL (SciFact, Milvus Lite; public call 2.06 ms wall,
this one 1.53 ms). When no payload is asked for, :func:`search_ids` builds the same
``SearchRequest`` pymilvus would (``Prepare.search_requests_with_expr``, consistency level and
guarantee timestamp included), sends it through the client's own gRPC stub and reads the answer's
``ids``/``scores``/``topks`` arrays.

This relies on pymilvus internals (``MilvusClient._get_connection()``, ``GrpcHandler._stub``)
within the pinned ``pymilvus>=2.5.10,<2.6``. :func:`available` checks them once and the store
falls back to the public API without them; the store contract test compares both paths.
"""

from __future__ import annotations

from typing import Any


def available(client: Any) -> bool:
    """Whether this pymilvus client exposes what :func:`search_ids` needs."""
    try:
        from pymilvus.client.prepare import Prepare
        from pymilvus.client.utils import check_status  # noqa: F401 - presence check

        handler = client._get_connection()
        return callable(getattr(handler._stub, "Search", None)) and callable(Prepare.search_requests_with_expr)
    except Exception:  # noqa: BLE001 - any missing internal means "use the public API"
        return False


def search_ids(  # noqa: PLR0913 - the search request's fields
    client: Any,
    collection: str,
    data: list[list[float]],
    limit: int,
    expr: str,
    params: dict[str, Any],
    consistency_level: str,
    timeout_s: float | None = None,
) -> list[tuple[list[str], list[float]]] | None:
    """k-NN search returning, per query, its ids and raw Milvus scores, best first.

    Args:
        client: A connected ``pymilvus.MilvusClient``.
        collection: Physical collection name.
        data: ``n`` query vectors.
        limit: Hits per query (top_k).
        expr: Milvus boolean filter expression, ``""`` for none.
        params: ``{"metric_type": ..., "params": {...}}`` as for ``MilvusClient.search``.
        consistency_level: ``Strong``, ``Session``, ``Bounded`` or ``Eventually``.
        timeout_s: gRPC deadline in seconds (``None``: none).

    Returns:
        ``n`` pairs ``(ids, scores)`` (Milvus distances: similarity for COSINE/IP, squared
        distance for L2), or ``None`` when the call failed in transport (then use pymilvus'
        public search, which retries transient gRPC failures).

    Raises:
        MilvusException: Milvus answered with an error status.
    """
    from pymilvus.client.prepare import Prepare
    from pymilvus.client.utils import check_status

    request = Prepare.search_requests_with_expr(
        collection, data, "", params, limit, expr, None, [], -1, consistency_level=consistency_level
    )
    try:
        response = client._get_connection()._stub.Search(request, timeout=timeout_s)
    except Exception:  # noqa: BLE001 - e.g. grpc.RpcError UNAVAILABLE
        return None  # the caller goes through pymilvus' public search, which retries
    check_status(response.status)
    results = response.results
    pks = results.ids.str_id.data if results.ids.HasField("str_id") else results.ids.int_id.data
    scores = results.scores
    out, start = [], 0
    for k in results.topks:
        out.append((list(pks[start : start + k]), list(scores[start : start + k])))
        start += k
    return out
