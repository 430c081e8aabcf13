"""The search route: hybrid, BM25-only or dense-only search with filters, paging and rerank."""

from __future__ import annotations

import time
from functools import partial

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from quarry import errors as e
from quarry import metrics
from quarry.api import shedding
from quarry.api.deps import SERVED_HEADERS, STORE_ERRORS, Service, version_headers
from quarry.api.errors import error_responses
from quarry.api.models import SearchIn, SearchOut
from quarry.service import Quarry
from retrieval.rerank_options import rerank_options
from retrieval.results import RerankOptions

router = APIRouter()


@router.post(
    "/v1/collections/{name}/search", tags=["search"], response_model=SearchOut,
    responses={**error_responses(
        e.InvalidQuery, e.InvalidFilter, e.InvalidRequest, e.CollectionNotFound, e.ModelMismatch,
        e.DimensionMismatch, *STORE_ERRORS, e.EmbeddingUnavailable, e.EmbeddingError, e.RerankError, body=True,
    ), 200: {"headers": SERVED_HEADERS}},
)
async def search(name: str, body: SearchIn, request: Request, q: Service) -> Response:
    """Hybrid (BM25 + dense, fused by rrf or weighted), BM25-only or dense-only search with filters and paging.

    Hybrid search answers from BM25 alone when the dense channel cannot (the store or the model
    is down, the collection's vectors come from another model) and says why in ``degraded``;
    dense-only search answers those with the error instead.

    \f
    The body is :class:`SearchOut`, serialised by orjson straight from the result's dataclasses
    (the hot path: no second validation pass over hits the service built itself). The query runs
    on the event loop and awaits the model and the store; a rerank (a cross-encoder, CPU-bound)
    runs in a worker thread. (FastAPI shows the text above the form feed as the description.)
    """  # noqa: D301 - the form feed is FastAPI's cut
    started = time.perf_counter()
    rerank = rerank_options_of(q, body)
    shed = shedding.shed(request)
    if shed is not None:  # saturated: BM25 alone where it is cheaper than what was asked, else the 503
        if body.mode == "dense" or (body.mode == "bm25" and rerank is None):
            raise await shed.refused()  # nothing cheaper than a dense-only or a plain BM25 search
        result = await q.search_async(
            name, body.query, top_k=body.top_k, mode="bm25", filters=body.filters, offset=body.offset,
            group=body.group_by_document, min_score=body.min_score,
        )
        result.mode = body.mode  # a hybrid search by BM25 alone, or a BM25 search without its rerank
        result.degraded.append(f"shed: the server is saturated and answers {shed.priority}-priority keys by BM25 alone")
        metrics.DEGRADED.labels("shed").inc()
        result.reranked, result.rerank_reason = (None, None) if rerank is None else (False, "shed")
    elif rerank is None:
        result = await q.search_async(
            name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters,
            offset=body.offset, group=body.group_by_document, fusion=body.fusion, min_score=body.min_score,
        )
    else:
        result = await run_in_threadpool(
            partial(
                q.search, name, body.query, top_k=body.top_k, mode=body.mode, filters=body.filters,
                offset=body.offset, group=body.group_by_document, rerank=rerank,
                dense_timeout_s=q.settings.search.dense_timeout_s, fusion=body.fusion, min_score=body.min_score,
            )
        )
    out = {
        "hits": result.hits, "total": result.total, "mode": result.mode, "offset": body.offset,
        "top_k": body.top_k, "degraded": result.degraded, "reranked": result.reranked,
        "rerank_reason": result.rerank_reason, "took_ms": (time.perf_counter() - started) * 1000,
        "timings_ms": result.timings_ms, "version": result.version, "rollout": result.rollout,
    }
    served = version_headers({"version": result.version, "rollout": result.rollout})
    return Response(orjson.dumps(out, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json",
                    headers=served)


def rerank_options_of(service: Quarry, body: SearchIn) -> RerankOptions | None:
    """The request's rerank options within the server's (``None``: no rerank for this search)."""
    loaded = service.reranker.model_id if service.reranker is not None else None
    return rerank_options(service.settings.rerank, loaded, body.rerank)
